"""Priority, gang admission, preemption with requeue, and the per-job preemption bound."""

from __future__ import annotations

import pytest

from fm_pipeline.scheduling import AdmissionError, Decision, JobRequest, TenantsConfigError
from tests.scheduling.conftest import HIGH, LOW, NORMAL, make_policy
from tests.scheduling.trace import SimJob, TraceRunner


def test_gang_admission_waits_for_the_whole_request():
    policy, _ = make_policy(8, [{"name": "t", "quota": {"gpu": 8}}])
    policy.submit(JobRequest.gpus("six", "t", 6, priority=NORMAL, seq=1))
    assert policy.schedule().admitted == ("six",)
    policy.submit(JobRequest.gpus("gang", "t", 4, priority=NORMAL, seq=2))
    policy.submit(JobRequest.gpus("two", "t", 2, priority=NORMAL, seq=3))
    # 2 GPUs are free: the 4-GPU gang does not start on part of its request, nobody is
    # preempted (same priority), and the smaller job behind it does not jump the queue.
    assert policy.schedule() == Decision()
    assert policy.usage("t") == {"gpu": 6}
    policy.release("six")
    assert policy.schedule().admitted == ("gang", "two")


def test_a_tenant_within_quota_goes_before_a_borrower(two_tenants):
    policy, _ = two_tenants
    policy.submit(JobRequest.gpus("borrower", "research", 6, priority=NORMAL, seq=1))
    policy.submit(JobRequest.gpus("in-quota", "prod", 4, priority=NORMAL, seq=2))
    assert policy.schedule().admitted == ("in-quota",)
    assert policy.queue_position("borrower") == 1


def test_within_a_tenant_priority_then_fifo(two_tenants):
    policy, _ = two_tenants
    policy.submit(JobRequest.gpus("first", "research", 8, priority=NORMAL, seq=1))
    policy.submit(JobRequest.gpus("second", "research", 8, priority=NORMAL, seq=2))
    policy.submit(JobRequest.gpus("urgent", "research", 8, priority=HIGH, seq=3))
    assert [policy.queue_position(j) for j in ("urgent", "first", "second")] == [1, 2, 3]
    assert policy.schedule().admitted == ("urgent",)
    assert policy.queue_position("first") == 1


def test_high_priority_job_preempts_low_priority_one_which_requeues_at_its_place(two_tenants):
    policy, clock = two_tenants
    policy.submit(JobRequest.gpus("low-a", "research", 4, priority=LOW, seq=1))
    policy.submit(JobRequest.gpus("low-b", "research", 4, priority=LOW, seq=2))
    policy.submit(JobRequest.gpus("low-c", "research", 4, priority=LOW, seq=3))  # waits
    clock.now = 100.0
    assert policy.schedule().admitted == ("low-a", "low-b")
    policy.submit(JobRequest.gpus("later", "research", 4, priority=LOW, seq=4))
    clock.now = 200.0
    policy.submit(JobRequest.gpus("hot", "research", 4, priority=HIGH, seq=5))

    decision = policy.schedule()
    # Same tenant, lower priority; of the two equal victims the most recently admitted
    # (least progress) goes; ties broken by submission order, newest first.
    assert [(p.victim, p.preemptor, p.reason) for p in decision.preempted] == [
        ("low-b", "hot", "priority")
    ]
    assert policy.is_stopping("low-b")
    policy.requeue("low-b")  # it checkpointed and exited
    assert policy.schedule().admitted == ("hot",)
    # Back at its original position: ahead of low-c and of the later submission.
    assert [j.job_id for j in policy.pending("research")] == ["low-b", "low-c", "later"]
    assert policy.queue_position("low-b") == 1


def test_other_tenants_lose_only_borrowed_capacity_never_their_quota(two_tenants):
    policy, _ = two_tenants
    policy.submit(JobRequest.gpus("p-quota", "prod", 4, priority=LOW, seq=1))
    policy.submit(JobRequest.gpus("r-quota", "research", 4, priority=LOW, seq=2))
    assert len(policy.schedule().admitted) == 2
    policy.submit(JobRequest.gpus("r-hot", "research", 4, priority=HIGH, seq=3))
    decision = policy.schedule()
    # prod is within its quota, so its low-priority job is safe; research's own is not.
    assert [(p.victim, p.reason) for p in decision.preempted] == [("r-quota", "priority")]


def test_preemptions_per_job_per_hour_are_bounded():
    policy, clock = make_policy(
        4, [{"name": "t", "quota": {"gpu": 4}, "priorities": ["low", "high"]}],
        preemption={"max_per_job_per_hour": 2},
    )
    policy.submit(JobRequest.gpus("victim", "t", 4, priority=LOW, seq=1))
    policy.schedule()
    for i in range(2):  # two preemptions within the hour are allowed
        clock.now += 60
        policy.submit(JobRequest.gpus(f"hot{i}", "t", 4, priority=HIGH, seq=10 + i))
        assert [p.victim for p in policy.schedule().preempted] == ["victim"]
        policy.requeue("victim")
        assert policy.schedule().admitted == (f"hot{i}",)
        clock.now += 60
        policy.release(f"hot{i}")
        assert policy.schedule().admitted == ("victim",)
    clock.now += 60
    policy.submit(JobRequest.gpus("hot2", "t", 4, priority=HIGH, seq=20))
    assert policy.schedule().preempted == ()  # a third one within the hour is not
    assert policy.preemptions_last_hour("victim") == 2
    clock.now += 3600  # an hour after the first preemption the budget is back
    assert [p.victim for p in policy.schedule().preempted] == ["victim"]


def test_preempted_job_checkpoints_requeues_and_finishes_without_losing_steps(two_tenants):
    policy, clock = two_tenants
    runner = TraceRunner(policy, clock, grace_s=120)
    low = SimJob(JobRequest.gpus("low", "research", 8, priority=LOW, seq=1),
                 submit_at=0, steps=100, step_s=60, ckpt_every=10, save_s=30)
    high = SimJob(JobRequest.gpus("high", "research", 8, priority=HIGH, seq=2),
                  submit_at=25 * 60 + 30, steps=20, step_s=60)
    runner.add(low)
    runner.add(high)
    runner.run(until=10 * 3600)
    assert low.history == ["queued", "started@0", "preempted@25->ckpt25", "requeued",
                           "started@25", "finished"]
    assert high.finished_at is not None and high.finished_at < low.finished_at
    # SIGTERM at step 25 (between periodic checkpoints 20 and 30): the save at the agreed
    # step 25 finished inside the grace period, so no step was computed twice.
    assert low.lost_steps == 0 and low.steps_computed == low.steps


def test_a_save_slower_than_the_grace_period_loses_at_most_the_steps_since_the_checkpoint(
    two_tenants,
):
    policy, clock = two_tenants
    runner = TraceRunner(policy, clock, grace_s=120)
    low = SimJob(JobRequest.gpus("low", "research", 8, priority=LOW, seq=1),
                 submit_at=0, steps=100, step_s=60, ckpt_every=10, save_s=600)
    runner.add(low)
    runner.add(SimJob(JobRequest.gpus("high", "research", 8, priority=HIGH, seq=2),
                      submit_at=27 * 60 + 5, steps=5))
    runner.run(until=10 * 3600)
    assert "preempted@27->ckpt20" in low.history and low.finished_at is not None
    assert 0 < low.lost_steps <= low.ckpt_every
    assert low.steps_computed == low.steps + low.lost_steps


@pytest.mark.parametrize(
    "request_, message",
    [
        (JobRequest.gpus("huge", "research", 9, priority=NORMAL, seq=1), "more than the whole pool"),
        (JobRequest.gpus("who", "nobody", 1, priority=NORMAL, seq=1), "unknown tenant 'nobody'"),
        (JobRequest.gpus("zero", "research", 0, priority=NORMAL, seq=1), "positive amount"),
        (JobRequest("tpu", "research", {"tpu": 1}, priority=NORMAL, seq=1), "which the pool lacks"),
    ],
)
def test_requests_that_could_never_start_are_refused(two_tenants, request_, message):
    policy, _ = two_tenants
    with pytest.raises(AdmissionError, match=message):
        policy.submit(request_)
    assert policy.pending() == []


def test_with_kueue_admitting_every_job_is_handed_over_and_nothing_is_preempted_here():
    # The same situation as above, with Kueue as the one that admits: all four go to it
    # at once, in fair-share order (prod's in-quota job before research's borrowers), and
    # no preemption is planned here: Kueue's ClusterQueues evict, or two schedulers race.
    tenants = [{"name": "research", "quota": {"gpu": 4}, "priorities": ["low", "high"]},
               {"name": "prod", "quota": {"gpu": 4}, "priorities": ["low", "high"]}]
    policy, _ = make_policy(8, tenants, launcher="kubernetes", admission="kueue")
    for seq, (name, tenant, prio) in enumerate([("low-a", "research", LOW),
                                                ("low-b", "research", LOW),
                                                ("low-c", "research", LOW)]):
        policy.submit(JobRequest.gpus(name, tenant, 4, priority=prio, seq=seq))
    assert policy.schedule().admitted == ("low-a", "low-b", "low-c")
    policy.submit(JobRequest.gpus("high", "prod", 8, priority=HIGH, seq=9))
    assert policy.schedule() == Decision(admitted=("high",))
    # Still a pool this job could never fit is refused at submission, as with the API's own.
    with pytest.raises(AdmissionError, match="gpu"):
        policy.submit(JobRequest.gpus("huge", "prod", 16, priority=HIGH, seq=10))


def test_kueue_admission_needs_the_kubernetes_launcher():
    with pytest.raises(TenantsConfigError, match="admission: kueue needs launcher: kubernetes"):
        make_policy(8, [{"name": "t", "quota": {"gpu": 8}}], admission="kueue")
