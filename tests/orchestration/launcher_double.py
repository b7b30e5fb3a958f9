"""A TEST DOUBLE of the launcher resources, for sensor and policy tests that must not pay
for torchrun: it "trains" by committing real checkpoints (CheckpointManager, a one-layer
state) at the job's checkpoint steps, appends the trainer's step records to
runs_dir/metrics.jsonl, and ends the way the real launchers do: a SegmentRun-like result,
or dagster.Failure built by the real `segment_failure` from a SegmentResult.

Faults come through the env the segment asset passes (FM_FAULT_FAIL_AT="RANK:STEP", as
for the real trainer); FM_DOUBLE_PREEMPT_AT="STEP" makes it checkpoint at STEP and exit
preempted (75). What the real trainer and launchers do is tested in tests/train and
tests/launch, and end to end in tests/test_demo.py (the demo's lineage).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import torch
from dagster import ConfigurableResource, MaterializeResult
from fm_pipeline.resources.launcher_results import segment_failure

from fm_pipeline.checkpoint import CheckpointManager, ModelState
from tests.local_site import runs_dir
from fm_pipeline.launch.outcome import Outcome, SegmentResult
from tests.orchestration.plans import step_of
from tests import local_site

PREEMPT_ENV = "FM_DOUBLE_PREEMPT_AT"


@dataclass
class DoubleRun:
    result: SegmentResult
    summary: dict

    def materialize_result(self) -> MaterializeResult:
        return MaterializeResult(metadata=self.summary)


def _newest_step(job) -> int:
    from fm_pipeline.catalog import latest_valid

    found = latest_valid(job, checksums=False, root=local_site.root_of(job))
    return found.found.step if found.found else 0


class LauncherDouble(ConfigurableResource):
    step_time_s: float = 0.01

    def launch_segment(self, context, *, job, end_step, overrides=(), extras=None,
                       placement=None, env=None, resume_from=None, planned=False):
        env = dict(env or {})
        # The trainer's rule: a plan yields to the newest valid checkpoint, a rollback not.
        start = _newest_step(job) if planned or not resume_from else step_of(resume_from)
        fail_after = int(env["FM_FAULT_FAIL_AT"].split(":")[1]) if env.get(
            "FM_FAULT_FAIL_AT") else None
        preempt_at = int(env[PREEMPT_ENV]) if env.get(PREEMPT_ENV) else None
        model = torch.nn.Linear(4, 4)
        manager = CheckpointManager(job, {"model": ModelState([model])}, async_save=False, site=local_site.site())
        t0 = time.monotonic()
        metrics = runs_dir(job.name) / "metrics.jsonl"
        metrics.parent.mkdir(parents=True, exist_ok=True)
        step = start
        outcome, reason, code = Outcome.SUCCEEDED, "completed", 0
        while step < end_step:
            if fail_after is not None and step == fail_after:
                outcome, code = Outcome.FAILED, 1
                reason = f"InjectedFault: rank 1 fails after step {step}"
                break
            step += 1
            with open(metrics, "a") as f:
                f.write(json.dumps({"kind": "step", "job": job.name, "time": time.time(),
                                    "step": step, "loss": 5.0 - 0.1 * step}) + "\n")
            stop = preempt_at is not None and step == preempt_at
            if step % job.checkpoint.every_steps == 0 or step == end_step or stop:
                manager.save(step, tokens_seen=step * job.tokens_per_step, final=True)
            if stop:
                outcome, code, reason = Outcome.PREEMPTED, 75, f"preempted at step {step}"
                break
        manager.close()
        result = SegmentResult(job=job.name, end_step=end_step, outcome=outcome,
                               exit_code=code, reason=reason, torchrun_exit_code=min(code, 1),
                               duration_s=time.monotonic() - t0 + 1.0,
                               failed_rank=1 if code == 1 else None)
        if outcome is not Outcome.SUCCEEDED:
            raise segment_failure(result)
        tokens_per_s = job.tokens_per_step / self.step_time_s
        return DoubleRun(result=result, summary={
            "start_step": start, "end_step": step, "final_loss": 5.0 - 0.1 * step,
            "mean_mfu": 0.1, "tokens_per_s": tokens_per_s, "outcome": "succeeded",
            "exit_code": 0, "duration_s": result.duration_s})
