"""Context parallelism is not in the trainer because torch's own (context_parallel, ring
attention) cannot run on the CPU, where everything here is tested: its ring kernels call
CUDA's flash, memory-efficient and cuDNN attention, and the CPU's SDPA kernel has no DTensor
sharding rule. This test holds that reason to what torch does today: if a torch upgrade
makes it run, it fails, and CP can be wired into the trainer and tested here (docs/trainer.md,
"Verified, and not"; the planner keeps CP plans "needs a GPU to verify" until then)."""

from __future__ import annotations

import json

from tests.parallel.workers import run_worker


def test_torch_context_parallel_still_refuses_the_cpu(tmp_path):
    run_worker("cp_worker.py", tmp_path)
    for rank in range(2):
        result = json.loads((tmp_path / f"cp-rank{rank}.json").read_text())
        assert not result["ran"], (
            f"torch {__import__('torch').__version__} now runs context_parallel on the CPU "
            f"({result}): wire CP into the trainer, test it here and make CP plans runnable")
        assert "_scaled_dot_product_flash_attention_for_cpu" in result["error"], result
        assert result["error"].startswith("NotImplementedError"), result
