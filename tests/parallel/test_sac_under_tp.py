"""The planner's recompute "op" (the trainer's activation_checkpoint selective) under tensor
parallelism keeps each row-parallel matmul's output whole on a tp rank: SAC stores the
DTensor the matmul returns, a partial sum of every token before its reduce-scatter, while
the column-parallel outputs are split by tp (planner/memory.py, layer_activations' op_extra).
Held to what torch does: if torch starts keeping the reduce-scattered shard, this fails and
the planner's memory for "op" under tp must shrink."""

from __future__ import annotations

import json

import pytest

from tests.parallel.workers import run_worker

pytestmark = pytest.mark.slow


def test_selective_checkpointing_keeps_row_parallel_outputs_whole_on_each_tp_rank(tmp_path):
    run_worker("sac_tp_worker.py", tmp_path)
    for rank in range(2):
        r = json.loads((tmp_path / f"sac-rank{rank}.json").read_text())
        tokens, tp = r["tokens"], 2
        matmuls = sorted((placement, tuple(shape)) for op, placement, shape in r["kept"]
                         if op.startswith("aten.mm"))
        assert matmuls == sorted([
            ("S(1)", (tokens, r["q_dim"] // tp)),  # Q
            ("S(1)", (tokens, r["kv_dim"] // tp)), ("S(1)", (tokens, r["kv_dim"] // tp)),
            ("S(1)", (tokens, r["ffn_dim"] // tp)), ("S(1)", (tokens, r["ffn_dim"] // tp)),
            ("P(sum)", (tokens, r["dim"])),  # the attention projection: whole
            ("P(sum)", (tokens, r["dim"])),  # the down projection: whole
        ]), r
