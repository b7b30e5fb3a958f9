"""Who may write a job's checkpoints, and what is never lost: the newest checkpoint corrupt
in both tiers and trained past, a second trainer started on a live job, and a checkpoint
tier on a read-only volume. Every figure is read from the run's own records (metrics.jsonl,
segments.jsonl, the checkpoints and what was set aside), none is assigned.
"""

from __future__ import annotations

import json
import time

from fm_pipeline.catalog import CheckpointRef, validate
from fm_pipeline.catalog.set_aside import list_set_aside
from fm_pipeline.catalog.refs import list_local, list_store, store_root
from fm_pipeline.launch.outcome import Outcome
from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.resilience import injectors
from fm_pipeline.resilience.matrix import FaultResult
from fm_pipeline.resilience.processes import LiveSegment
from fm_pipeline.resilience.recovery import decide, resume
from fm_pipeline.resilience.scenarios.common import first_line
from fm_pipeline.resilience.workspace import ChaosWorkspace
from fm_pipeline.rundir.events import append_event
from fm_pipeline.storage import open_store

NEWEST = 6


def _manifests(refs) -> dict[int, bytes]:
    return {r.step: r.read_bytes("manifest.json") for r in refs if r.has("manifest.json")}


def corrupt_both_tiers(ws: ChaosWorkspace) -> FaultResult:
    job = ws.job("chaos-both-tiers", **{"checkpoint.upload": True, "checkpoint.keep_last": 5})
    result = FaultResult("ckpt-corrupt-both-tiers", expected=(
        "the resume falls back to the previous checkpoint, trains back up to the corrupt "
        "step and saves it again, valid, in both tiers; the corrupt copies are set aside with "
        "the reason, never deleted; the older valid checkpoints are untouched"))
    ws.prepare(job)
    store = open_store(str(ws.store_dir))
    base = LiveSegment(SegmentLaunch(job, end_step=NEWEST), site=ws.site).start().result()
    if not base.ok:
        raise RuntimeError(f"the base run failed: {base.reason}")
    local, remote = ws.site.runs_dir(job.name) / "checkpoints", store_root(job.name)
    before = {"local": _manifests(list_local(local)),
              "store": _manifests(list_store(store, remote))}
    victim = injectors.checkpoint_victim(ws.checkpoint_dir(job.name, NEWEST))
    injected = injectors.flip_byte(victim)
    injectors.flip_byte(ws.store_dir / remote / f"step-{NEWEST:08d}" / victim.name)
    result.injected = f"{injected} of step {NEWEST}, in the local tier and in the store"
    # Damage at rest has no moment a launcher sees: the next restore finds it, and that is
    # inside the time to resume.
    append_event(ws.site.runs_dir(job.name), "fault_injected", fault=result.fault, target=result.injected,
                 step=NEWEST, detect=False)
    resumed = resume(ws, job, end_step=job.training.steps)
    result.record_figures(ws.site.runs_dir(job.name))
    copies = {"local": CheckpointRef.local(local / f"step-{NEWEST:08d}"),
              "store": CheckpointRef.remote(store, f"{remote}/step-{NEWEST:08d}")}
    aside = [e for e in list_set_aside(job.name, store=store, root=ws.site.checkpoints_dir(job.name)) if e.ref.step == NEWEST]
    result.outcome = (f"resumed from step {resumed.restored_step}, "
                      f"{resumed.result.outcome.value} at step {resumed.segment.get('end_step')}"
                      f"; step {NEWEST} saved again in "
                      f"{sum(not validate(r, job) for r in copies.values())}/2 tiers; "
                      f"{len(aside)} corrupt copies set aside ("
                      f"{', '.join(e.kind for e in aside)})")
    result.check(f"the resume restored step {NEWEST - 2}, not the corrupt step {NEWEST} "
                 f"(restored {resumed.restored_step})", resumed.restored_step == NEWEST - 2)
    result.check(f"the segment completed at step {job.training.steps}", resumed.completed)
    for tier, ref in copies.items():
        result.check(f"{tier}: step {NEWEST} is a new checkpoint and validates",
                     not validate(ref, job) and
                     ref.read_bytes("manifest.json") != before[tier][NEWEST])
    for tier, refs in (("local", list_local(local)), ("store", list_store(store, remote))):
        now = _manifests(refs)
        older = [s for s in before[tier] if s < NEWEST]
        result.check(f"{tier}: the older checkpoints {older} are byte-for-byte untouched and "
                     "valid", all(now.get(s) == before[tier][s] for s in older) and
                     all(not validate(r, job) for r in refs if r.step in older))
    result.check("both corrupt copies are set aside, kept, with the reason naming the file: "
                 f"{first_line(aside[0].reason, 100) if aside else 'none'!r}",
                 sorted(e.ref.is_local for e in aside) == [False, True] and
                 all(victim.name in e.reason for e in aside))
    result.check(f"steps trained twice, from metrics.jsonl: {result.steps_lost} (the two "
                 "after the restored checkpoint)", result.steps_lost == 2)
    return result


def second_trainer(ws: ChaosWorkspace) -> FaultResult:
    # Long and slow enough that the first still trains when the second has started up.
    job = ws.job("chaos-two-trainers", **{"training.steps": 24, "training.segment_steps": 24})
    result = FaultResult("second-trainer", expected=(
        "the second trainer exits 3 (lease held) before touching anything, naming the "
        "holder; the first trains every step once and completes; the policy does not treat "
        "the refusal as the job's failure"))
    ws.prepare(job)
    slow = {"FM_FAULT_SLOW_RANKS": "0:1.0,1:1.0"}
    first = LiveSegment(SegmentLaunch(job, end_step=job.training.steps), site=ws.site, env=slow).start()
    try:
        first.wait_for_step(2)
        holder = json.loads((ws.site.runs_dir(job.name) / "lease.json").read_text())
        t0 = time.time()
        result.injected = (f"a second torchrun on job {job.name} while the first (rank 0 pid "
                           f"{holder['pid']}) was at step {first.steps()[-1]['step']}")
        append_event(ws.site.runs_dir(job.name), "fault_injected", fault=result.fault, target=result.injected,
                     step=first.steps()[-1]["step"])
        second = LiveSegment(SegmentLaunch(job, end_step=job.training.steps), site=ws.site).start()
        refused = second.result()
        done = first.result()
    finally:
        first.cleanup()
    decision, _ = decide(refused, failed_at_step=None, start_step=None)
    steps = [r["step"] for r in first.steps()]
    segments = ws.segments(job.name, since=t0 - 60)
    result.record_figures(ws.site.runs_dir(job.name))
    result.outcome = (f"second: {refused.outcome.value} (exit {refused.exit_code}) after "
                      f"{refused.duration_s:.1f} s: {first_line(refused.reason, 110)}; first: "
                      f"{done.outcome.value} at step {done.end_step}")
    result.check(f"the second trainer ends lease_held with exit 3 (got {refused.outcome.value} "
                 f"exit {refused.exit_code})",
                 refused.outcome is Outcome.LEASE_HELD and refused.exit_code == 3)
    result.check("its reason names the holder (id, host and pid)",
                 holder["holder"] in refused.reason and f"pid {holder['pid']}" in refused.reason)
    result.check(f"the first trainer completes (at step {done.end_step})", done.ok)
    result.check(f"every step 1..{job.training.steps} trained exactly once (metrics.jsonl: "
                 f"{steps})", steps == list(range(1, job.training.steps + 1)))
    result.check(f"one segment record, the first's ({len(segments)} recorded)",
                 len(segments) == 1)
    result.check(f"the policy does not resume or count it ({decision.reason[:70]}...)",
                 not decision.resume and "live segment" in decision.reason)
    return result


def read_only_tier(ws: ChaosWorkspace) -> FaultResult:
    job = ws.job("chaos-read-only")
    result = FaultResult("read-only-ckpt", expected=(
        "exit 2 (permanent: no retry can fix it) with one line naming the read-only "
        "directory, before the first step; the policy stops"))
    ws.prepare(job)
    ckpts = ws.site.runs_dir(job.name) / "checkpoints"
    with injectors.read_only_dir(ckpts):
        result.injected = f"{ckpts} on a read-only tmpfs (mount -o ro)"
        append_event(ws.site.runs_dir(job.name), "fault_injected", fault=result.fault, target=result.injected)
        live = LiveSegment(SegmentLaunch(job, end_step=job.training.steps), site=ws.site).start()
        failed = live.result()
        trained = live.steps()
    decision, _ = decide(failed, failed_at_step=None, start_step=0)
    result.record_figures(ws.site.runs_dir(job.name))
    result.outcome = (f"{failed.outcome.value} (exit {failed.exit_code}): "
                      f"{first_line(failed.reason, 120)}")
    result.check(f"exit 2, the permanent code (got {failed.outcome.value} exit "
                 f"{failed.exit_code})",
                 failed.outcome is Outcome.BAD_CONFIG and failed.exit_code == 2)
    result.check("the reason is one line naming the read-only directory",
                 "Read-only file system" in failed.reason and str(ckpts) in failed.reason and
                 "\n" not in failed.reason.strip())
    result.check(f"no step trained ({len(trained)} logged)", not trained)
    result.check(f"the policy stops ({decision.reason[:60]}...)", not decision.resume)
    return result
