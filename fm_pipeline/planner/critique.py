"""What a job spec declares, checked against its plan, with the numbers that make the case:
precision, the checkpoint interval against Young/Daly's optimum, segment length against the
relaunch each segment pays, the preemption grace period against the checkpoint it must
hold.

    from fm_pipeline.planner.job_plan import job_critique
    for f in job_critique(job):
        print(f"{f.field}: {f.message} (suggested: {f.suggested})")

Segment length and grace period are judged on GPU clusters only: a CPU job is a demo or a
test, relaunched by local processes in seconds, not by a scheduler in minutes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fm_pipeline.planner.estimate import Estimate, estimate
from fm_pipeline.planner.reliability import reliability

GOODPUT_TOLERANCE = 0.005  # a declared interval costing less than half a point is fine
SEGMENT_RELAUNCH_SHARE = 0.02  # at most 2% of the wall clock relaunching between segments
GRACE_MARGIN = 1.5  # the preemption save must fit the grace period with this margin
GRACE_SLACK_S = 10.0  # plus SIGTERM delivery, the step in flight, the process exit


@dataclass(frozen=True)
class Finding:
    field: str  # the job-spec field it is about
    message: str
    suggested: int | float | str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def critique(job, inp: dict, est: Estimate) -> list[Finding]:
    """Every finding at once (empty: nothing to say) for a job spec, its planner inputs
    (job_plan.job_inputs) and the estimate of its declared layout."""
    on_gpus = job.cluster.accelerator.lower() != "cpu"
    findings = [*_precision(job, inp, est, on_gpus), *_interval(job, inp, est)]
    if on_gpus:
        findings += [*_segments(job, est), *_grace(job, est)]
    return findings


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _precision(job, inp: dict, est: Estimate, on_gpus: bool):
    if not on_gpus or inp["precision"] != "fp32":
        return
    bf16 = estimate(inp["shape"], inp["cluster"], inp["layout"],
                    global_batch_tokens=inp["global_batch_tokens"], precision="bf16")
    acc = inp["cluster"].accelerator
    yield Finding(
        "parallelism.mixed_precision",
        f"fp32 on {acc.name}: matmuls at the TF32 peak ({acc.peak_fp32_flops / 1e12:.0f} "
        f"TFLOP/s) instead of bf16's ({acc.peak_bf16_flops / 1e12:.0f}); predicted "
        f"{est.metrics['tokens_per_s']:,.0f} tokens/s against {bf16.metrics['tokens_per_s']:,.0f}"
        " in bf16", "bf16")


def _interval(job, inp: dict, est: Estimate):
    best = est.reliability
    step_s = est.metrics["step_time_s"]
    declared = job.checkpoint.every_steps
    at = reliability(params=inp["shape"].params().total, gpus=inp["layout"].gpus,
                     cluster=inp["cluster"], step_time_s=step_s,
                     async_save=inp["async_checkpoint"], interval_steps=declared)
    lost = best.goodput - at.goodput
    backlog = inp["async_checkpoint"] and at.interval_s < best.checkpoint_write_s
    if lost < GOODPUT_TOLERANCE and not backlog:
        return
    mtbf = "no failures expected" if best.job_mtbf_h is None or math.isinf(best.job_mtbf_h) \
        else f"a job MTBF of {best.job_mtbf_h:.1f} h"
    why = (f"every {declared} steps ({_duration(at.interval_s)}) against the optimum "
           f"{best.interval_steps} ({_duration(best.interval_s)}) for {mtbf} and a "
           f"{best.checkpoint_blocking_s:.2g} s blocking save: goodput {at.goodput:.1%} vs "
           f"{best.goodput:.1%}")
    if lost > 0:
        why += f", {lost * inp['layout'].gpus * 24:,.0f} GPU-hours a day lost to the difference"
    if backlog:
        why += (f"; a save takes {_duration(best.checkpoint_write_s)} to write "
                f"({best.checkpoint_gb:,.0f} GB), longer than the interval: each save waits "
                "for the previous one and the store writes nonstop")
    yield Finding("checkpoint.every_steps", why, best.interval_steps)


def segment_steps_for(est: Estimate, *, every_steps: int, total_steps: int) -> int:
    """The shortest segment whose relaunch (reschedule, rendezvous, restore) takes at most
    SEGMENT_RELAUNCH_SHARE of the wall clock, ending on a checkpoint."""
    relaunch, step_s = est.reliability.restart_s, est.metrics["step_time_s"]
    steps = math.ceil(relaunch * (1 / SEGMENT_RELAUNCH_SHARE - 1) / step_s)
    return max(1, min(total_steps, -(-steps // every_steps) * every_steps))


def grace_s_for(est: Estimate) -> int:
    """A grace period that holds the checkpoint a preemption writes, with margin."""
    rel = est.reliability
    return math.ceil((rel.checkpoint_blocking_s + rel.checkpoint_write_s) * GRACE_MARGIN
                     + GRACE_SLACK_S)


def _segments(job, est: Estimate):
    rel, step_s = est.reliability, est.metrics["step_time_s"]
    relaunch = rel.restart_s  # reschedule, rendezvous, restore: what each segment pays
    segment_s = job.training.segment_steps * step_s
    share = relaunch_share(est, job.training.segment_steps)
    if share <= SEGMENT_RELAUNCH_SHARE:
        return
    steps = segment_steps_for(est, every_steps=job.checkpoint.every_steps,
                              total_steps=job.training.steps)
    at = relaunch_share(est, steps)
    said = (f"segments of {job.training.segment_steps} steps ({_duration(segment_s)}) each "
            f"pay a relaunch of {_duration(relaunch)} (cluster.restart_overhead_s plus the "
            f"restore): {share:.0%} of the wall clock; ")
    if at <= SEGMENT_RELAUNCH_SHARE:
        said += f"{steps} steps keeps it under {SEGMENT_RELAUNCH_SHARE:.0%} ({at:.1%})"
    else:  # the whole job is shorter than one segment that would amortise the relaunch
        said += (f"even one segment for all {job.training.steps} steps of the job "
                 f"({_duration(job.training.steps * step_s)}) pays {at:.0%}: the job is "
                 f"too short to keep relaunches under {SEGMENT_RELAUNCH_SHARE:.0%}")
    yield Finding("training.segment_steps", said, steps)


def relaunch_share(est: Estimate, segment_steps: int) -> float:
    """The share of the wall clock a segment of this many steps spends relaunching."""
    relaunch = est.reliability.restart_s
    return relaunch / (segment_steps * est.metrics["step_time_s"] + relaunch)


def _grace(job, est: Estimate):
    rel = est.reliability
    needed = rel.checkpoint_blocking_s + rel.checkpoint_write_s
    grace = job.training.preemption_grace_s
    if grace >= needed * GRACE_MARGIN:
        return
    suggested = grace_s_for(est)
    yield Finding(
        "training.preemption_grace_s",
        f"{grace:.0f} s (the pods' grace period) is shorter than the checkpoint a preemption "
        f"saves: {rel.checkpoint_gb:,.0f} GB written in {_duration(rel.checkpoint_write_s)} "
        f"at cluster.storage_write_gbps; the pods would be killed mid-save, losing up to "
        f"{_duration(rel.interval_s)} of work", suggested)
