"""Expert parallelism against the layer held whole: 2 gloo ranks, each with its own
tokens, the 8 experts split 4 + 4 and the rows sent over all_to_all_single and back. The
outputs, the inputs' gradients, the router's and the experts' gradients match the whole
layer's; also when every token goes to the first rank's experts (the other receives no
rows and still takes part in every collective)."""

from __future__ import annotations

import pytest
import torch

from tests.parallel.workers import run_worker


@pytest.mark.parametrize("routing", ["random", "skewed"])
def test_dispatched_experts_compute_what_the_whole_layer_does(tmp_path, routing):
    run_worker("ep_worker.py", tmp_path, routing, timeout=180)
    for rank in range(2):
        r = torch.load(tmp_path / f"rank{rank}.pt")
        for name in ("y", "dx", "dw1", "router"):
            torch.testing.assert_close(r[f"{name}_sharded"], r[f"{name}_whole"],
                                       rtol=1e-5, atol=1e-6, msg=f"{name} on rank {rank}")
        whole, sharded = r["stats"]
        assert whole == sharded
        if routing == "skewed":  # capacity 1.5: the overflow of the favoured experts drops
            assert whole["dropped_tokens"] > 0
            assert sum(whole["tokens_per_expert"][4:]) == 0
