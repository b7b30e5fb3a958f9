"""One candidate's predictions as plain numbers (what `--json` prints and the plan records)."""

from __future__ import annotations

from fm_pipeline.planner.collectives import LEVEL_NAMES
from fm_pipeline.planner.memory import FRAGMENTATION, GIB
from fm_pipeline.planner.step import Evaluation


def plan_metrics(ev: Evaluation, i: int) -> dict:
    step = float(ev.step_time_s[i])
    mem = ev.memory

    def share(x) -> float:
        return float(x[i]) / step

    return {
        "step_time_s": step,
        "tokens_per_s": float(ev.tokens_per_s[i]),
        "mfu": float(ev.mfu[i]),
        "hfu": float(ev.hfu[i]),
        "memory_gib_per_gpu": float(mem.total_gib[i]),
        "memory_capacity_gib": float(mem.capacity_gib),
        "fits": bool(mem.fits[i]),
        "microbatches": int(ev.microbatches[i]),
        "compute_fraction": share(ev.compute_s),
        "exposed_comm_fraction": share(ev.exposed_comm_s),
        "bubble_fraction": share(ev.bubble_s),
        "optimizer_fraction": share(ev.optimizer_s),
        "time_s": {
            "compute": float(ev.compute_s[i]), "bubble": float(ev.bubble_s[i]),
            "tp_comm": float(ev.tp_comm_s[i]), "cp_comm": float(ev.cp_comm_s[i]),
            "pp_comm": float(ev.pp_comm_s[i]), "dp_comm": float(ev.dp_comm_s[i]),
            "ep_comm": float(ev.ep_comm_s[i]),
            "optimizer": float(ev.optimizer_s[i]),
        },
        "memory_gib": {
            "weights": float(mem.weights[i]) / GIB, "grads": float(mem.grads[i]) / GIB,
            "optimizer": float(mem.optimizer[i]) / GIB,
            "activations": float(mem.activations[i]) / GIB, "working": float(mem.working[i]) / GIB,
            "fragmentation_margin": FRAGMENTATION,
        },
        "groups_reach": {
            "tp": LEVEL_NAMES[int(ev.tp_level[i])], "cp": LEVEL_NAMES[int(ev.cp_level[i])],
            "pp": LEVEL_NAMES[int(ev.pp_level[i])], "dp": LEVEL_NAMES[int(ev.dp_level[i])],
            "ep": LEVEL_NAMES[int(ev.ep_level[i])],
        },
    }
