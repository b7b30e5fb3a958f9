"""The resume policy and the job registry, without Dagster: the rules a user relies on when a
segment dies at 3 a.m."""

from __future__ import annotations

import pytest
import torch

from fm_pipeline.orchestration import (
    RetryPolicy,
    SegmentAttempt,
    decide_after_failure,
    register_job,
    registered_job,
    registered_jobs,
)
from fm_pipeline.config import dump_job
from fm_pipeline.config.strict_yaml import dump_yaml
from fm_pipeline.orchestration.registry import UnknownJob, spec_key
from fm_pipeline.orchestration.segments import (
    SegmentNotRunnable,
    SegmentPlan,
    plan_segment,
    plan_tiers,
    same_checkpoint,
)
from fm_pipeline.storage import open_store
from tests.orchestration.conftest import job_spec
from tests import local_site


def failure(run: str, *, at: int | None, reason: str = "RuntimeError: NCCL timeout",
            outcome: str = "failed", ended: float = 1000.0, code: int = 1) -> SegmentAttempt:
    return SegmentAttempt(run_id=run, outcome=outcome, ended_at=ended, reason=reason,
                          exit_code=code, failed_at_step=at)


def ok(run: str, ended: float) -> SegmentAttempt:
    return SegmentAttempt(run_id=run, outcome="succeeded", ended_at=ended, exit_code=0)


POLICY = RetryPolicy(max_consecutive_failures=3, max_failures=5, backoff_base_s=30,
                     backoff_max_s=100)


def test_backoff_doubles_per_failure_in_a_row_up_to_the_cap():
    waits = []
    earlier: list[SegmentAttempt] = []
    for i, step in enumerate((11, 12, 13)):
        f = failure(f"r{i}", at=step, ended=1000.0 + i)
        d = decide_after_failure(f, earlier=earlier, policy=POLICY)
        assert d.resume
        waits.append(d.not_before - f.ended_at)
        earlier.append(f)
    assert waits == [30, 60, 100]


def test_a_successful_segment_resets_the_failures_in_a_row():
    earlier = [failure("a", at=5, ended=1), failure("b", at=6, ended=2), ok("c", 3)]
    d = decide_after_failure(failure("d", at=9, ended=4), earlier=earlier, policy=POLICY)
    assert d.resume and d.failures_in_a_row == 1 and d.not_before == 4 + 30


def test_the_same_failure_at_the_same_step_twice_is_a_crash_loop():
    first = failure("a", at=25, reason="RuntimeError: CUDA error: an illegal memory access "
                                       "(pid 41231, port 29517)")
    again = failure("b", at=25, ended=2000, reason="RuntimeError: CUDA error: an illegal memory "
                                                   "access (pid 50999, port 29533)")
    d = decide_after_failure(again, earlier=[first], policy=POLICY)
    assert not d.resume and "crash loop" in d.reason and "step 25 2 times" in d.reason


def test_the_same_failure_at_another_step_is_retried():
    d = decide_after_failure(failure("b", at=31, ended=2000), earlier=[failure("a", at=25)],
                             policy=POLICY)
    assert d.resume


def test_the_retry_budget_stops_the_job_with_the_last_reason():
    earlier = [failure(f"r{i}", at=i, ended=float(i)) for i in range(3)]
    d = decide_after_failure(failure("x", at=9, ended=10, reason="OOM on rank 3"),
                             earlier=earlier, policy=POLICY)
    assert not d.resume and "4 failures in a row (budget 3)" in d.reason
    assert "OOM on rank 3" in d.reason
    life = [failure(f"f{i}", at=100 + i, ended=float(10 * i)) for i in range(5)] + \
        [ok(f"o{i}", float(10 * i + 5)) for i in range(5)]
    d = decide_after_failure(failure("y", at=200, ended=100), earlier=life, policy=POLICY)
    assert not d.resume and "6 failures in the job's life (budget 5)" in d.reason


def test_preemption_resumes_at_once_and_never_counts():
    earlier = [failure(f"r{i}", at=i, ended=float(i)) for i in range(3)]
    pre = failure("p", at=40, outcome="preempted", code=75, ended=50, reason="SIGTERM")
    d = decide_after_failure(pre, earlier=earlier, policy=POLICY)
    assert d.resume and d.not_before == 50
    following = decide_after_failure(failure("q", at=41, ended=60), earlier=[*earlier, pre],
                                     policy=POLICY)
    assert not following.resume  # the 4th real failure in a row: the preemption did not reset


def test_a_bad_config_is_never_retried():
    d = decide_after_failure(failure("a", at=None, outcome="bad_config", code=2,
                                     reason="seq_len 4096 exceeds model max_seq_len"),
                             earlier=[], policy=POLICY)
    assert not d.resume and "retrying cannot fix it" in d.reason and "seq_len 4096" in d.reason


def test_segments_follow_the_segment_boundaries_up_to_the_target():
    training = job_spec("bounds", **{"training.steps": 50, "training.segment_steps": 20}).training
    assert training.segment_end(0) == 20
    assert training.segment_end(27) == 40  # after a preemption at 27
    assert training.segment_end(40) == 50


def test_a_segment_plan_starts_at_the_newest_valid_checkpoint_or_the_one_chosen(tmp_path):
    from fm_pipeline.checkpoint import CheckpointManager
    from fm_pipeline.checkpoint.state import ModelState

    store = open_store(str(tmp_path / "store"))
    job = job_spec("plans", **{"training.steps": 6, "training.segment_steps": 4,
                               "checkpoint.every_steps": 2})
    assert plan_segment(job, store, site=local_site.site()) == SegmentPlan(0, 4, None)  # from scratch
    manager = CheckpointManager(job, {"model": ModelState([torch.nn.Linear(2, 2)])},
                                store=store, async_save=False, site=local_site.site())
    for step in (2, 4):
        manager.save(step, tokens_seen=step * job.tokens_per_step, final=True)
    manager.close()
    newest = plan_segment(job, store, site=local_site.site())
    assert (newest.start, newest.end, newest.chosen) == (4, 6, False)
    assert newest.checkpoint.rstrip("/").endswith("step-00000004")
    older = newest.checkpoint.replace("step-00000004", "step-00000002")
    assert plan_segment(job, store, resume_from=older, site=local_site.site()) == SegmentPlan(2, 4, older, chosen=True)
    with pytest.raises(SegmentNotRunnable, match="is not a checkpoint of job plans"):
        plan_segment(job, store, resume_from="/nowhere/step-00000002", site=local_site.site())
    with pytest.raises(SegmentNotRunnable, match="has nothing to train"):
        plan_segment(job, store, end_step=4, site=local_site.site())
    # A Kubernetes launch's pods cannot read this process's local tier: its plan names the
    # store's copy of the same checkpoint, and a request planned on the local copy is not
    # "replanned" by that (the same step, another tier).
    on_k8s = plan_segment(job, store, site=local_site.site(), target="kubernetes")
    assert (on_k8s.start, on_k8s.end) == (4, 6)
    assert on_k8s.checkpoint.startswith(store.uri) and on_k8s.checkpoint != newest.checkpoint
    assert same_checkpoint(newest.checkpoint, on_k8s.checkpoint)
    assert not same_checkpoint(older, on_k8s.checkpoint)
    assert not same_checkpoint("scratch", on_k8s.checkpoint)
    assert plan_tiers(job.model_copy(update={"checkpoint": job.checkpoint.model_copy(
        update={"upload": False})}), "kubernetes") == ("local", "store")


def test_a_registered_spec_is_parsed_once_per_process(tmp_path, monkeypatch):
    import fm_pipeline.orchestration.registry as registry

    store = open_store(str(tmp_path / "store"))
    job = job_spec("parsed-once")
    parsed = []
    real = registry.parse_job
    monkeypatch.setattr(registry, "parse_job", lambda *a, **k: parsed.append(1) or real(*a, **k))
    register_job(store, job)
    assert registered_job(store, "parsed-once") is job  # the registering process: no parse
    assert parsed == []
    # Registered by another process (another writer of the same store): parsed once here.
    changed = job_spec("parsed-once", **{"training.steps": 12})
    store.put_bytes(dump_yaml(dump_job(changed)).encode(), spec_key("parsed-once"))
    first = registered_job(store, "parsed-once")
    assert first == changed and all(registered_job(store, "parsed-once") is first
                                    for _ in range(5))
    assert len(parsed) == 1


def test_the_first_backoff_alone_can_be_set_and_raises_the_cap_when_longer():
    assert RetryPolicy.first_backoff(3) == RetryPolicy(backoff_base_s=3)
    assert RetryPolicy.first_backoff(2000).backoff_max_s == 2000


@pytest.mark.parametrize("bad", [dict(backoff_base_s=-1), dict(crash_loop_repeats=1),
                                 dict(backoff_base_s=10, backoff_max_s=5)])
def test_policy_rejects_nonsense(bad):
    with pytest.raises(ValueError):
        RetryPolicy(**bad)


def test_registry_keeps_one_spec_per_job_name(tmp_path):
    store = open_store(str(tmp_path / "store"))
    job = job_spec("registered")
    register_job(store, job)
    register_job(store, job)  # the same spec again: fine
    assert registered_job(store, "registered") == job and registered_jobs(store) == ["registered"]
    other = job_spec("registered", **{"training.steps": 12, "training.lr": 1e-3})
    with pytest.raises(ValueError, match=r"differs in training\.lr, training\.steps"):
        register_job(store, other)
    register_job(store, other, replace=True)
    assert registered_job(store, "registered").training.steps == 12
    with pytest.raises(UnknownJob, match=r"'nope' is not registered .*\(registered: registered\)"):
        registered_job(store, "nope")
