"""torchrun worker for test_sac_under_tp: the debug model under tp 2 with the trainer's
activation_checkpoint "selective" (op-level SAC), one forward; writes, per rank, what SAC
kept in the first block: (op, placement, local shape) of each kept output, to
$OUT/sac-rank<r>.json. What the planner's recompute "op" assumes (planner/memory.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from fm_pipeline.data.testing import small_job
from fm_pipeline.parallel import ParallelDims, build_parallel_model, init_distributed
from fm_pipeline.parallel import activation_checkpoint

MODES: list = []


def recording(policy_fn, *args, **kwargs):
    forward, recompute = torch.utils.checkpoint.create_selective_checkpoint_contexts(
        policy_fn, *args, **kwargs)
    MODES.append(forward)
    return forward, recompute


def kept(mode) -> list:
    out = []
    for key, entries in mode.storage.items():
        for entry in entries.values():
            value = getattr(entry, "val", None)
            if isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value
                out.append([str(key), str(getattr(value, "placements", ["plain"])[0]),
                            list(local.shape)])
    return out


def main(out_dir: str) -> None:
    activation_checkpoint.create_selective_checkpoint_contexts = recording
    device = init_distributed()
    job = small_job(**{"model.size": "debug", "model.vocab_size": 512, "training.seq_len": 32,
                       "training.global_batch_size": 2, "training.micro_batch_size": 1,
                       "parallelism.nproc_per_node": 2, "parallelism.tp": 2,
                       "parallelism.dp_shard": 1,
                       "parallelism.activation_checkpoint": "selective"})
    dims = ParallelDims.from_spec(job.parallelism, world_size=dist.get_world_size())
    pm = build_parallel_model(job, mesh=dims.build_mesh(device.type), dims=dims, device=device)
    batch = torch.randint(0, 512, (1, 33), generator=torch.Generator().manual_seed(7))
    pm.parts[0](batch[:, :-1])  # what the forward kept (backward's recompute consumes it)
    cfg = job.model_cfg
    result = {"kept": kept(MODES[0]), "dim": cfg.dim, "ffn_dim": cfg.ffn_dim,
              "q_dim": cfg.n_heads * cfg.head_dim, "kv_dim": cfg.n_kv_heads * cfg.head_dim,
              "tokens": 32}
    Path(out_dir, f"sac-rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
