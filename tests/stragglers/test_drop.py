"""The drop's arithmetic and decisions (fm_pipeline.stragglers.drop), and the watch's policy
on synthetic gathers: drop a slow compute rank's rows, end when it recovers, and under
`auto` stop to exclude once the dropped work has cost one relaunch (rent or buy)."""

from __future__ import annotations

import pytest

from fm_pipeline.data.testing import small_job
from fm_pipeline.rundir.events import read_events
from fm_pipeline.stragglers.detector import StragglerEvent
from fm_pipeline.stragglers.drop import DropController
from fm_pipeline.stragglers.watch import StragglerWatch
from tests import local_site


def _records(step: int, *, slow: float = 1.0, work: float = 1.0, rows_s: float = 0.1,
             world: int = 4, slow_rank: int = 1) -> list[dict]:
    """One gather: every rank computes rows_s per step; `slow_rank` `slow` times longer per
    row, computing `work` of its rows."""
    out = []
    for r in range(world):
        mine = rows_s * (slow * work if r == slow_rank else 1.0)
        compute = mine + 0.02
        out.append(dict(step=step, rank=r, host=f"node-{r}", local_rank=r, peer_group=0,
                        compute_s=compute, collective_wait_s=0.001, data_wait_s=0.001,
                        step_time_s=0.2, work_fraction=work if r == slow_rank else 1.0,
                        rows_s=mine, steps=1))
    return out


def _event(rank=1, section="compute", severity=1.0) -> StragglerEvent:
    return StragglerEvent(rank=rank, host=f"node-{rank}", section=section, severity=severity,
                          section_ratio=2.0, z=9.0, first_step=1, detected_step=8,
                          last_step=8, idle_gpu_hours=0.0)


def test_a_twice_as_slow_rank_computes_half_its_rows_and_the_cost_is_spelled_out():
    drops = DropController(full_rows=4, dp=4, world_size=4, tokens_per_step=4 * 4 * 4 * 32,
                           relaunch_cost_s=60.0)
    action, refused, cost = drops.start(_event(), _records(8, slow=2.0))
    assert (action, refused) == ("drop", None)
    assert drops.plan() == [4, 2, 4, 4]
    # 2 of rank 1's 4 rows = 1/8 of the global batch, every step: 1/8 x 0.2 s x 4 GPUs.
    assert cost["drop_cost_gpu_s_per_step"] == pytest.approx(0.1)
    assert cost["relaunch_cost_gpu_s"] == 240.0 and cost["break_even_steps"] == 2400.0
    assert cost["tokens_dropped_per_step"] == 256
    # Still slow per row while dropping: the cost grows, the plan stays.
    assert drops.account(_records(9, slow=2.0, work=0.5)) == []
    assert drops.drops[1].cost_gpu_s == pytest.approx(0.1) and drops.drops[1].tokens == 256
    # Recovered (per row as fast as its peers even at half its rows): the drop ends.
    ((kind, end),) = drops.account(_records(10, slow=1.0, work=0.5))
    assert kind == "straggler_drop_end" and end["why"] == "recovered"
    assert end["tokens_dropped"] == 512 and drops.plan() is None


@pytest.mark.parametrize("layout, section, why", [
    ({"tp": 2}, "compute", "tp 2 x pp 1"),
    ({}, "data_wait", "computing fewer rows does not shorten it"),
])
def test_drop_is_refused_where_fewer_rows_cannot_help(layout, section, why):
    job = small_job(**{"parallelism.nproc_per_node": 4,
                       **{f"parallelism.{k}": v for k, v in layout.items()}})
    drops = DropController.for_job(job, world_size=4)
    action, refused, _ = drops.start(_event(section=section), _records(8, slow=2.0))
    assert action == "drop_refused" and why in refused and drops.plan() is None


def _job(policy: str, **extra):
    return small_job(**{"name": f"drop-{policy}", "parallelism.nproc_per_node": 4,
                        "resilience.straggler_policy": policy, "resilience.straggler_window": 4,
                        "resilience.straggler_persist": 3, **extra})


def _feed(watch, *, steps: range, slow: float):
    """Gathers of rank 1 `slow` times slower per row, computing what the plan says; until
    the watch asks for a stop (the segment then stops after the next step)."""
    for step in steps:
        plan = watch.row_plan()
        work = 1.0 if plan is None else plan[1] / 2
        stop = watch.update(_records(step, slow=slow, work=work, rows_s=0.1))
        if stop:
            return stop
    return None


def test_auto_drops_a_new_straggler_then_stops_once_the_drop_has_cost_a_relaunch(fm_home):
    # A relaunch of 0.3 s on 4 GPUs = 1.2 GPU-s; dropping 1 of rank 1's 2 rows costs
    # 1/8 x 0.2 s x 4 = 0.1 GPU-s per step: 12 steps of dropping, then the stop.
    job = _job("auto", **{"training.micro_batch_size": 2, "resilience.relaunch_cost_s": 0.3})
    watch = StragglerWatch(job, segment="s1", world_size=4, gather_every=1, runs=local_site.runs_dir(job.name))
    stop = _feed(watch, steps=range(1, 9), slow=2.0)
    raised, _ = read_events(local_site.runs_dir(job.name), kinds=("straggler",))
    assert stop is None and [e["action"] for e in raised] == ["drop"]
    assert raised[0]["cost"]["rows_kept"] == 1 and watch.row_plan() == [2, 1, 2, 2]
    stop = _feed(watch, steps=range(9, 30), slow=2.0)
    assert stop and "dropped rows cost" in stop and "one relaunch" in stop
    raised, _ = read_events(local_site.runs_dir(job.name), kinds=("straggler",))
    switched = raised[-1]
    assert switched["action"] == "exclude" and switched["switched_from"] == "drop"
    assert switched["cost"]["drop_cost_gpu_s_so_far"] >= switched["cost"]["relaunch_cost_gpu_s"]
    (ended,) = read_events(local_site.runs_dir(job.name), kinds=("straggler_drop_end",))[0]
    assert ended["why"] == "switched to exclude" and ended["tokens_dropped"] > 0
    assert watch.row_plan() is None  # the stop: nobody drops in the last step


def test_drop_keeps_dropping_and_writes_the_drops_end_when_the_segment_ends(fm_home):
    job = _job("drop", **{"training.micro_batch_size": 2, "resilience.relaunch_cost_s": 0.3})
    watch = StragglerWatch(job, segment="s1", world_size=4, gather_every=1, runs=local_site.runs_dir(job.name))
    assert _feed(watch, steps=range(1, 40), slow=2.0) is None  # never stops
    watch.close(end_step=39)
    (ended,) = read_events(local_site.runs_dir(job.name), kinds=("straggler_drop_end",))[0]
    assert ended["why"] == "segment ended" and ended["tokens_dropped"] > 0
