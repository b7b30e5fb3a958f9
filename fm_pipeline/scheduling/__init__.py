"""Who gets GPUs when jobs contend: tenants, gang admission, fair share, preemption.

Pure domain logic, deterministic, no I/O, no sleeping: the same policy admits local runs
(the REST control plane, `fm_pipeline.api`) and replays job traces in the cluster
simulator (`fm_pipeline.sim`). Kubernetes gets the same rules as Kueue objects
(`fm_pipeline.scheduling.kueue.render_kueue`).

    from fm_pipeline.scheduling import FairSharePolicy, JobRequest, load_tenants

    clock = lambda: sim_now                      # any () -> seconds; time.time by default
    policy = FairSharePolicy(load_tenants("configs/tenants.yaml"), clock=clock)
    policy.submit(JobRequest.gpus("j1", "research", 8, priority=1000, seq=1))
    decision = policy.schedule()                 # Decision(admitted=(...), preempted=(...))
    for job_id in decision.admitted: ...         # start it
    for p in decision.preempted: ...             # SIGTERM p.victim (for p.preemptor, p.reason)
    policy.requeue("j0")                         # a preempted job exited after its checkpoint
    policy.release("j1")                         # a running job ended (done, failed, cancelled)

The rules:
- Gang admission: a job starts only when all its resources fit at once.
- Within a tenant: higher priority first, then submission order (`seq`); the head blocks
  the rest of its tenant's queue (Kueue StrictFIFO).
- Between tenants: the head whose tenant would have the lowest weighted dominant share
  (usage above quota / pool, dominant resource, / weight) goes first, so tenants within
  their quota always come before borrowers, and idle quota is lent by weight.
- Preemption (see `preemption.py`): reclaim of borrowed capacity, lower priority, or
  fair share; minimal victim set; at most `preemption.max_per_job_per_hour` per job.
- A preempted job keeps its `seq`, so `requeue` puts it back at its original position.
  Capacity its victims free is held for the preemptor until it starts.

`check(job)` says up front whether a request could ever start. Verbs raise `AdmissionError` (a ValueError) for requests that could never start and for
verbs on jobs in the wrong state. Queries: `queue_position`, `pending`, `running`,
`usage`, `share`, `resource_seconds` (accounting, e.g. GPU-seconds per tenant),
`preemptions_last_hour`, `is_stopping`.
"""

from fm_pipeline.scheduling.admission import AdmissionError, Decision, FairSharePolicy
from fm_pipeline.scheduling.preemption import Preemption
from fm_pipeline.scheduling.request import JobRequest
from fm_pipeline.scheduling.tenants import (
    DEFAULT_TENANTS,
    TenantsConfig,
    TenantsConfigError,
    TenantSpec,
    load_tenants,
    parse_tenants,
)

__all__ = [
    "DEFAULT_TENANTS", "AdmissionError", "Decision", "FairSharePolicy", "JobRequest",
    "Preemption", "TenantSpec", "TenantsConfig", "TenantsConfigError", "load_tenants",
    "parse_tenants",
]
