"""parallelism.fsdp_keep_gathered: FSDP2 keeps the weights gathered through a step's
micro-batches and reduces the gradients once, at its end. Counted on 2 gloo ranks with 4
micro-batches a step: one all-gather and one reduce-scatter per FSDP unit per step, against
the default's per-micro-batch gathers (forward, then again in backward for every unit it
resharded) and reductions. The same losses and weights as the default, to float rounding:
not bit for bit, because the gradient sum is grouped the other way (each rank sums its
micro-batches, then the ranks are reduced; the default reduces each micro-batch, then sums)
and float addition is not associative (docs/trainer.md)."""

from __future__ import annotations

import pytest
import torch

from tests.parallel.workers import run_worker


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("keep")
    run_worker("fsdp_keep_worker.py", out)
    return {keep: [torch.load(out / f"keep{keep}-rank{r}.pt") for r in range(2)]
            for keep in (0, 1)}


def test_one_all_gather_and_one_reduce_scatter_per_unit_per_step(runs):
    for rank in range(2):
        keep, default = runs[1][rank], runs[0][rank]
        units, micro = keep["units"], keep["micro_batches"]
        assert micro == 4 and units >= 3
        assert keep["per_step"] == [{"all_gather": units, "reduce_scatter": units}] * 3
        # The default: every unit gathered per micro-batch in forward, and again in
        # backward but the last block (kept after forward: backward needs it at once);
        # reduced each micro-batch.
        assert default["per_step"] == [{"all_gather": micro * (2 * units - 1),
                                         "reduce_scatter": micro * units}] * 3


def test_the_same_training_as_the_default_to_float_rounding(runs):
    for rank in range(2):
        keep, default = runs[1][rank], runs[0][rank]
        assert keep["losses"][0] == default["losses"][0]  # the first step: the same weights
        torch.testing.assert_close(torch.tensor(keep["losses"]), torch.tensor(default["losses"]),
                                   rtol=1e-6, atol=0)
        for name, weight in default["weights"].items():
            torch.testing.assert_close(keep["weights"][name], weight, rtol=0, atol=1e-4,
                                       msg=name)
    assert runs[1][0]["weights"].keys() == runs[1][1]["weights"].keys()
