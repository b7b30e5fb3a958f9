"""Request and response bodies of the training-jobs API (they make up /openapi.json)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Priority = Literal["low", "normal", "high", "urgent"]
JobStatusName = Literal[
    "queued", "restarting", "running", "preempting", "cancelling",
    "succeeded", "failed", "cancelled",
]


class _Body(BaseModel):
    # strict: 8 is an integer, "8" and true are not (JSON has the types; no coercion)
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ParallelismBody(_Body):
    tp: int = Field(default=1, ge=1, le=1024, description="tensor-parallel degree")
    pp: int = Field(default=1, ge=1, le=1024, description="pipeline-parallel degree")
    dp: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="data-parallel (FSDP shard) degree; default gpus / (tp x pp)",
    )


class JobCreate(_Body):
    """The seed's training-job body, plus priority and a few optional training knobs."""

    model: str = Field(min_length=1, max_length=64, description="a size from the model registry")
    gpus: int = Field(ge=1, le=1_000_000, description="the whole gang: nnodes x gpus_per_node")
    parallelism: ParallelismBody = ParallelismBody()
    checkpoint_every_steps: int = Field(default=100, ge=1, le=10_000_000)
    data_manifest: str = Field(
        min_length=1, max_length=1024,
        description="a prepared data mix in the job store: its manifest URI, "
        "data/<mix_key>/manifest.json, or the mix key",
    )
    priority: Priority = "normal"
    steps: int | None = Field(default=None, ge=1, le=100_000_000, description="target step")
    segment_steps: int | None = Field(
        default=None, ge=1, le=100_000_000,
        description="steps per torchrun segment (training.segment_steps; default 20): the "
                    "value a training.segment_steps warning suggests")
    gpus_per_node: int | None = Field(default=None, ge=1, le=64, description="default: 8")
    global_batch_size: int | None = Field(default=None, ge=1, le=100_000_000,
                                          description="sequences per step")
    micro_batch_size: int | None = Field(default=None, ge=1, le=1_000_000)
    seq_len: int | None = Field(
        default=None, ge=2, le=1 << 24,
        description="tokens per sequence; must be the data mix's (its samples are windows "
                    "of that length); default: the mix's")
    global_batch_tokens: int | None = Field(
        default=None, ge=1, le=1 << 40,
        description="tokens per optimizer step (a multiple of seq_len); instead of "
                    "global_batch_size")
    training_tokens: int | None = Field(
        default=None, ge=1, le=10**16,
        description="the token budget: steps = ceil(training_tokens / tokens per step); "
                    "instead of steps")
    precision: Literal["fp32", "bf16", "fp8", "fp8-tensorwise", "fp8-rowwise"] | None = Field(
        default=None, description="parallelism.mixed_precision; default: bf16 on a GPU pool, "
                                  "fp32 on CPUs")


class ResumeBody(_Body):
    checkpoint: str | None = Field(
        default=None, min_length=1, max_length=1024,
        description="a checkpoint of this job (its location or step-XXXXXXXX); "
        "default: the latest valid one",
    )


class Finding(BaseModel):
    field: str = Field(description="the job-spec field it is about")
    message: str
    suggested: int | float | str | None = None


class JobAccepted(BaseModel):
    job_id: str
    status: JobStatusName


class JobSubmitted(JobAccepted):
    warnings: list[Finding] = Field(
        default_factory=list, description="the planner's critique of what the job declares "
        "(on a GPU pool; left out when empty): queued anyway, each with numbers and a "
        "suggested value")


class RouterStats(BaseModel):
    """A Mixture-of-Experts job's routing at its latest step, over all ranks and layers."""

    max_load: float | None = Field(description="busiest expert's token-slots / the mean "
                                               "(1: balanced)")
    dropped_slots: int = Field(description="token-slots dropped at expert capacity")
    slots: int = Field(description="token-slots routed")


class JobStatus(BaseModel):
    job_id: str
    tenant: str
    status: JobStatusName
    priority: Priority
    model: str
    gpus: int
    submitted_at: float = Field(description="Unix seconds")
    queue_position: int | None = Field(description="1-based place in the tenant's queue")
    step: int | None
    target_step: int
    mfu: float | None
    step_time_ms: float | None
    tokens_per_s: float | None
    goodput: float | None
    last_ckpt: str | None = Field(description="location of the newest committed checkpoint")
    last_ckpt_step: int | None
    queued_by: str | None = Field(default=None, description=(
        "Kubernetes pools: why Kueue holds the job's segment (queued for quota, or evicted "
        "and waiting to be readmitted), while status is queued because of it"))
    failure_reason: str | None
    gpu_hours: float = Field(description="GPU-hours held by this job's runs so far")
    cost_usd: float
    preemptions: int
    inplace_restarts: int = Field(default=0, description=(
        "workers restarted inside a segment by torchrun (each restored from the fast tier "
        "when it could, else the durable one; the events say which)"))
    runs: int
    router: RouterStats | None = Field(default=None, description="MoE jobs only")


class JobList(BaseModel):
    jobs: list[JobStatus]


class CheckpointInfo(BaseModel):
    step: int
    location: str
    tier: Literal["local", "store"]
    committed: bool = Field(description="manifest.json present and well-formed")
    tokens_seen: int | None
    created_at: str | None
    total_bytes: int | None
    problem: str | None
    marks: list[str]
    superseded: str | None = Field(default=None, description=(
        "why a rollback abandoned it: the job was resumed from an older checkpoint; it is "
        "kept but never resumed from"))


class CheckpointList(BaseModel):
    checkpoints: list[CheckpointInfo]


class Evaluation(BaseModel):
    step: int
    checkpoint: str
    written_at: str | None
    results: dict


class EvaluationList(BaseModel):
    evaluations: list[Evaluation]


class Event(BaseModel):
    at: float = Field(description="Unix seconds")
    kind: str
    detail: dict


class EventList(BaseModel):
    events: list[Event]


class TenantUsage(BaseModel):
    tenant: str
    weight: float
    quota_gpus: int
    used_gpus: int
    share: float = Field(description="weighted dominant share of borrowed capacity")
    queued: int
    running: int
    priorities: list[Priority]


class TenantList(BaseModel):
    pool_gpus: int
    tenants: list[TenantUsage]


class Message(BaseModel):
    detail: str


class FieldProblem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationProblems(BaseModel):
    detail: list[FieldProblem]
