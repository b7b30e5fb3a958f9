"""Storage faults: the object store going down in the middle of a checkpoint upload, and the
checkpoint disk filling up during a save.

Decided behaviour (docs/resilience.md):
  s3-down    training continues: the local checkpoint is committed and intact, the remote
             copy stays uncommitted (no manifest in the store, so store-tier discovery never
             picks it), the failure is recorded in marks/upload.json, and once the endpoint
             is back the next save (or sync_to_store) uploads what is pending.
  disk-full  the segment fails with the write error named (an async save's failure surfaces
             at the next save); the partial checkpoint has no manifest and is never chosen;
             once space is freed the job resumes from the newest valid checkpoint.
"""

from __future__ import annotations

import time

from fm_pipeline.launch.spec import SegmentLaunch
from fm_pipeline.resilience.injectors import small_disk
from fm_pipeline.resilience.matrix import FaultResult
from fm_pipeline.resilience.processes import LiveSegment
from fm_pipeline.resilience.recovery import decide, last_step, resume
from fm_pipeline.resilience.scenarios.common import describe_outcome, first_line
from fm_pipeline.resilience.workspace import ChaosWorkspace
from fm_pipeline.rundir.events import append_event

CUT_STEP = 4
DISK_BYTES = 6 << 20  # one 2-rank checkpoint of the debug model (3.8 MB) fits, two do not


def s3_down(ws: ChaosWorkspace) -> FaultResult:
    from fm_pipeline.catalog import CheckpointRef, sync_to_store, validate
    from fm_pipeline.catalog.marks import read_mark
    from fm_pipeline.resilience.s3_outage import OutageEndpoint

    job = ws.job("chaos-s3-down", **{"checkpoint.upload": True})
    result = FaultResult("s3-down", expected=(
        "training continues; the checkpoint is committed locally and stays uncommitted in "
        "the store (no manifest), the upload error is recorded; pending uploads go through "
        "once the endpoint is back"))
    end = job.training.steps
    with OutageEndpoint() as s3:
        bucket = f"fm-chaos-{int(time.time() * 1000)}"  # moto's state outlives a server
        s3.create_bucket(bucket)
        store = s3.store(bucket)
        env = {"FM_STORE_URI": store.uri, "FM_S3_ENDPOINT_URL": s3.url, **s3.credentials}
        # A warm node-local shard cache (as after the first segment on a node): the data
        # loader does not depend on the store once training runs.
        ws.prepare(job, store).verify()
        marker = f"step-{CUT_STEP:08d}/".encode()
        s3.cut_when(marker)
        live = LiveSegment(SegmentLaunch(job, end_step=end), site=ws.site, env=env).start()
        try:
            while not s3.wait_down(timeout_s=0.2) and live.running:
                pass
            down = s3.down
            result.injected = (f"endpoint stopped (relay closed, moto stopped) at the first "
                               f"upload request of step {CUT_STEP}: "
                               f"{(s3.cut_request or b'').decode(errors='replace')[:80]}")
            # Nothing ends: "Detected after" does not apply (detect=False).
            append_event(ws.site.runs_dir(job.name), "fault_injected", fault="s3-down", target=result.injected,
                         step=last_step(live), detect=False)
            ran = live.result()
        finally:
            live.cleanup()
        local = {s: validate(ws.checkpoint_dir(job.name, s), job)
                 for s in (CUT_STEP, end) if ws.checkpoint_dir(job.name, s).is_dir()}
        mark = read_mark(CheckpointRef.local(ws.checkpoint_dir(job.name, CUT_STEP)), "upload")
        s3.restore()  # nothing was written to the store since it went down: look now
        remote = {s for s in (2, 4, 6, 8)
                  if store.exists(f"checkpoints/{job.name}/step-{s:08d}/manifest.json")}
        t0 = time.time()
        reports = sync_to_store(job.name, store, root=ws.site.checkpoints_dir(job.name))
        synced = [r.step for r in reports if r.committed]
        remote_end = validate(CheckpointRef.remote(store, f"checkpoints/{job.name}/"
                                                          f"step-{end:08d}"), job)
    result.record_figures(ws.site.runs_dir(job.name))
    result.outcome = (f"{ran.outcome.value} at step {end}; store committed steps "
                      f"{sorted(remote) or 'none'} during the outage; sync afterwards "
                      f"uploaded {synced or 'nothing'} in {time.time() - t0:.1f} s")
    result.check(f"the endpoint went down mid-upload of step {CUT_STEP}", down)
    result.check(f"training continued to step {end} ({ran.outcome.value})",
                 ran.ok and (last_step(live) or 0) >= end)
    result.check(f"local checkpoints {sorted(local)} committed and intact",
                 len(local) == 2 and all(p == [] for p in local.values()))
    result.check(f"no remote manifest for step {CUT_STEP} or later (uncommitted in the store)",
                 not {s for s in remote if s >= CUT_STEP})
    result.check(f"the upload failure is recorded in marks/upload.json: "
                 f"{first_line(str((mark or {}).get('error')), 90)!r}",
                 bool(mark) and not mark.get("committed", True) and bool(mark.get("error")))
    result.check(f"after the endpoint is back, sync_to_store commits step {end} remotely and "
                 f"it validates", end in synced and remote_end == [])
    return result


def disk_full(ws: ChaosWorkspace) -> FaultResult:
    job = ws.job("chaos-disk-full")
    ws.prepare(job)
    end = job.training.steps
    result = FaultResult("disk-full", expected=(
        "the segment fails naming the write error; the partial checkpoint is never chosen; "
        "after space is freed the job resumes from the newest valid checkpoint"))
    directory = ws.site.runs_dir(job.name) / "checkpoints"
    with small_disk(directory, size_bytes=DISK_BYTES) as disk:
        result.injected = (f"checkpoint directory on a {DISK_BYTES >> 20} MiB tmpfs (a real "
                           "mount; one checkpoint fits, the second write hits ENOSPC)")
        # Present from the launch, with no moment of injection: no "Detected after".
        append_event(ws.site.runs_dir(job.name), "fault_injected", fault="disk-full", target=result.injected,
                     detect=False)
        live = LiveSegment(SegmentLaunch(job, end_step=end), site=ws.site).start()
        try:
            failed = live.result()
        finally:
            live.cleanup()
        reached = last_step(live)
        newest, skipped = ws.newest_valid(job)
        text = f"{failed.reason}\n{failed.traceback or ''}"
        decision, _ = decide(failed, failed_at_step=reached, start_step=0)
        disk.grow(64 << 20)  # the operator frees space
        append_event(ws.site.runs_dir(job.name), "fault_cleared", fault="disk-full", what="64 MiB free")
        resumed = resume(ws, job, end_step=end) if decision.resume else None
    result.outcome = describe_outcome(failed) + (
        f"; resumed from step {resumed.restored_step}" if resumed else "")
    result.record_figures(ws.site.runs_dir(job.name))
    result.check(f"the segment fails ({failed.outcome.value}, exit {failed.exit_code})",
                 not failed.ok and failed.exit_code not in (0, 75))
    result.check("the reason shows the disk is full (ENOSPC, or 0 MB free)",
                 any(w in text for w in ("No space left", "ENOSPC", "Errno 28", "(0.0 MB free")))
    result.check(f"the incomplete checkpoint is skipped with its reason: "
                 f"{first_line(skipped[0].split(': ', 1)[-1], 90) if skipped else 'none'!r}",
                 bool(skipped) and "manifest.json" in skipped[0])
    result.check(f"the orchestration policy resumes ({decision.reason[:90]})", decision.resume)
    result.check(f"resumed from the newest valid checkpoint (step {newest}) and completed",
                 resumed is not None and newest is not None
                 and resumed.restored_step == newest and resumed.completed)
    return result
