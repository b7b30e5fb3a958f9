"""The Job spec: everything a training job declares, parsed and validated once.

    from fm_pipeline.config import load_job
    job = load_job("configs/demo.yaml")      # raises JobSpecError naming each bad field

Sections: model, parallelism, training, data, checkpoint, cluster, resilience, plus
owner/tenant and priority. Cross-field rules (degrees multiply to the world size, heads
divisible by tp, layers divisible by pipeline stages, batch divisible by data-parallel
ranks) live here so that nothing invalid is ever launched.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fm_pipeline.accelerators import catalog_price
from fm_pipeline.cluster_defaults import default
from fm_pipeline.model.config import ModelConfig
from fm_pipeline.model.registry import get_model_config, model_names

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Upper bounds where torch, numpy or the token shards would overflow, or past anything a
# run could mean: refused here, naming the field, not discovered inside a worker.
MAX_STEPS = 10**9          # 3 years at 10 steps/s
MAX_SEED = 2**32 - 1       # numpy's legacy seeds; torch's per-rank seeds stay in int64
MAX_VOCAB = 2**32          # token ids are stored as uint32 at most
MAX_SEQ = 2**24
MAX_DIM = 2**20
MAX_COUNT = 2**31 - 1      # batch sizes, degrees, ranks: int32 in collectives and shapes


def compute_dtype(mixed_precision: str) -> str:
    """The dtype everything but FP8 linear layers computes in: FP8 training is bf16 training
    with FP8 GEMMs (MFU is quoted against the bf16 peak)."""
    return "fp32" if mixed_precision == "fp32" else "bf16"


def fp8_recipe(mixed_precision: str) -> str | None:
    """torchao's recipe name for an FP8 precision ("tensorwise", "rowwise"), else None."""
    return mixed_precision.removeprefix("fp8-") if mixed_precision.startswith("fp8-") else None

Priority = Literal["low", "normal", "high", "urgent"]
PRIORITY_VALUES: dict[str, int] = {"low": 100, "normal": 1000, "high": 10000, "urgent": 100000}


class _Strict(BaseModel):
    # strict: no "8" -> 8 or true -> 1; allow_inf_nan: every number is finite
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    """A named size from the registry, with optional overrides of any shape field."""

    size: str = "tiny"
    n_layers: int | None = Field(default=None, gt=0, le=4096)
    dim: int | None = Field(default=None, gt=0, le=MAX_DIM)
    n_heads: int | None = Field(default=None, gt=0, le=4096)
    n_kv_heads: int | None = Field(default=None, gt=0, le=4096)
    ffn_dim: int | None = Field(default=None, gt=0, le=MAX_DIM)
    vocab_size: int | None = Field(default=None, gt=0, le=MAX_VOCAB)
    max_seq_len: int | None = Field(default=None, gt=0, le=MAX_SEQ)
    rope_theta: float | None = Field(default=None, gt=0)
    tie_embeddings: bool | None = None
    # Mixture of Experts (fm_pipeline/model/config.py says what each does)
    n_experts: int | None = Field(default=None, ge=0, le=2**16)
    moe_top_k: int | None = Field(default=None, gt=0, le=2**16)
    moe_ffn_dim: int | None = Field(default=None, gt=0, le=MAX_DIM)
    moe_shared_experts: int | None = Field(default=None, ge=0, le=2**16)
    moe_every: int | None = Field(default=None, gt=0, le=4096)
    moe_first_dense: int | None = Field(default=None, ge=0, le=4096)
    moe_capacity_factor: float | None = Field(default=None, ge=0)
    moe_aux_loss_coef: float | None = Field(default=None, ge=0)
    moe_bias_update_rate: float | None = Field(default=None, ge=0)

    @field_validator("size")
    @classmethod
    def _known_size(cls, v: str) -> str:
        if v not in model_names():
            raise ValueError(f"unknown model size {v!r}; known sizes: {', '.join(model_names())}")
        return v

    def resolve(self) -> ModelConfig:
        overrides = {k: v for k, v in self.model_dump(exclude={"size"}).items() if v is not None}
        return get_model_config(self.size, **overrides)


class ParallelismSpec(_Strict):
    """Degrees of the device mesh, outermost first: dp_replicate x dp_shard x pp x tp."""

    nnodes: int = Field(default=1, gt=0, le=2**20)
    nproc_per_node: int = Field(default=1, gt=0, le=1024)
    dp_replicate: int = Field(default=1, gt=0, le=MAX_COUNT)
    dp_shard: int = Field(default=-1, le=MAX_COUNT, description="-1: whatever the other degrees leave")
    tp: int = Field(default=1, gt=0, le=MAX_COUNT)
    pp: int = Field(default=1, gt=0, le=MAX_COUNT)
    ep: int = Field(default=1, gt=0, le=MAX_COUNT, description="expert parallel: MoE experts sharded over ep "
                                                 "of the dp_shard ranks (must divide it)")
    pp_schedule: Literal["1F1B", "Interleaved1F1B", "GPipe"] = "1F1B"
    pp_microbatches: int | None = Field(
        default=None, gt=0, le=MAX_COUNT, description="default: global_batch_size / dp / micro_batch_size"
    )
    pp_virtual_stages: int = Field(default=1, gt=0, le=4096, description="model chunks per pp rank")
    pp_layers_per_stage: list[int] | None = Field(
        default=None, description="transformer layers of each pipeline stage in order (pp x "
        "pp_virtual_stages entries, each >= 1, summing to n_layers), e.g. Llama 3's first and "
        "last stage one layer lighter for the embedding and the output head; left out: "
        "equal counts")
    activation_checkpoint: Literal["none", "selective", "full"] = "none"
    fsdp_keep_gathered: bool = Field(
        default=False, description="keep FSDP's weights gathered through every micro-batch "
        "of a step and reduce the gradients once at its end (ZeRO-1 as FSDP2 runs it: one "
        "all-gather and one reduce-scatter per parameter per step, at the memory of the "
        "whole weights and the whole fp32 gradients). Pipeline stages always do this")
    mixed_precision: Literal["fp32", "bf16", "fp8-tensorwise", "fp8-rowwise"] = Field(
        default="fp32", description="left out: bf16 when cluster.accelerator is a GPU, fp32 "
                                    "on cpu (JobSpec fills it in). fp8-*: bf16 training with "
                                    "the blocks' linear layers in FP8 (torchao Float8Linear, "
                                    "per-tensor or per-row scales); fp8 = fp8-tensorwise")

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _fp8_recipe(cls, v):
        if v == "fp8":
            return "fp8-tensorwise"
        if v == "fp8-blockwise":
            raise ValueError("fp8-blockwise (DeepSeek-V3's 128-element blocks) is planned by "
                             "the planner but not trained here: use fp8-tensorwise or "
                             "fp8-rowwise (torchao Float8Linear)")
        return v

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def resolved_dp_shard(self) -> int:
        """dp_shard for this spec's world size: the declared degree, or what the other degrees
        leave when it is -1 (the declared -1 stays in the spec: a launch on another world
        size re-derives it, fm_pipeline.parallel.ParallelDims)."""
        if self.dp_shard != -1:
            return self.dp_shard
        return self.world_size // (self.dp_replicate * self.tp * self.pp)

    @property
    def dp(self) -> int:
        """Total data-parallel degree (replicas x shards): how many distinct batches per step."""
        return self.dp_replicate * self.resolved_dp_shard

    @model_validator(mode="after")
    def _degrees(self) -> "ParallelismSpec":
        others = self.dp_replicate * self.tp * self.pp
        if self.dp_shard == -1:
            if self.world_size % others:
                raise ValueError(
                    f"world size {self.world_size} (nnodes {self.nnodes} x nproc_per_node "
                    f"{self.nproc_per_node}) is not divisible by dp_replicate "
                    f"{self.dp_replicate} x tp {self.tp} x pp {self.pp} = {others}"
                )
        elif self.dp_shard < 1:
            raise ValueError(f"dp_shard must be >= 1 or -1 (infer), got {self.dp_shard}")
        product = others * self.resolved_dp_shard
        if product != self.world_size:
            raise ValueError(
                f"dp_replicate {self.dp_replicate} x dp_shard {self.resolved_dp_shard} x tp {self.tp} "
                f"x pp {self.pp} = {product} must equal world size {self.world_size} "
                f"(nnodes {self.nnodes} x nproc_per_node {self.nproc_per_node})"
            )
        if self.resolved_dp_shard % self.ep:
            raise ValueError(
                f"ep {self.ep} must divide dp_shard {self.resolved_dp_shard}: the expert-parallel "
                "ranks are data-parallel ranks (ep is carved out of dp_shard)")
        if self.pp == 1 and (self.pp_schedule == "Interleaved1F1B" or self.pp_virtual_stages > 1):
            raise ValueError("pp_schedule Interleaved1F1B / pp_virtual_stages > 1 need pp > 1")
        if self.pp_schedule == "Interleaved1F1B" and self.pp_virtual_stages < 2:
            raise ValueError("pp_schedule Interleaved1F1B needs pp_virtual_stages >= 2")
        if self.pp_schedule != "Interleaved1F1B" and self.pp_virtual_stages != 1:
            raise ValueError(
                f"pp_virtual_stages {self.pp_virtual_stages} needs pp_schedule Interleaved1F1B"
            )
        return self


class TrainingSpec(_Strict):
    seq_len: int = Field(default=128, gt=1, le=MAX_SEQ)
    global_batch_size: int = Field(default=16, gt=0, le=MAX_COUNT, description="sequences per optimizer step")
    micro_batch_size: int = Field(default=4, gt=0, le=MAX_COUNT, description="sequences per forward pass")
    steps: int = Field(default=60, gt=0, le=MAX_STEPS, description="the job's target step")
    segment_steps: int = Field(default=20, gt=0, le=MAX_STEPS, description="steps per torchrun segment")
    lr: float = Field(default=3e-3, gt=0)
    min_lr: float = Field(default=3e-4, ge=0)
    warmup_steps: int = Field(default=10, ge=0, le=MAX_STEPS)
    weight_decay: float = Field(default=0.1, ge=0)
    beta1: float = Field(default=0.9, gt=0, lt=1)
    beta2: float = Field(default=0.95, gt=0, lt=1)
    grad_clip: float = Field(default=1.0, gt=0)
    seed: int = Field(default=1234, ge=0, le=MAX_SEED)
    log_every: int = Field(default=1, gt=0, le=MAX_STEPS)
    rank_timings_every: int = Field(default=10, gt=0, le=MAX_STEPS, description="per-rank timings every K steps")
    preemption_grace_s: float = Field(default=25.0, gt=0)
    compile: bool = Field(
        default=False, description="torch.compile each transformer block (inductor; on CPU "
                                   "it needs a C++ compiler)")

    @model_validator(mode="after")
    def _lr(self) -> "TrainingSpec":
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        return self

    def segment_end(self, start_step: int) -> int:
        """Where a segment starting at `start_step` stops: the next multiple of
        segment_steps, capped at the target. The one segment-end rule: the orchestrators,
        the trainer's default --end-step and the JobSet renderer all ask here."""
        return min(self.steps, (start_step // self.segment_steps + 1) * self.segment_steps)


class SourceSpec(_Strict):
    name: str = Field(min_length=1)
    uri: str = Field(min_length=1, description="local directory/file or s3://bucket/prefix")
    weight: float = Field(gt=0)
    format: Literal["auto", "text", "jsonl", "parquet", "python-code", "python-docstrings"] = "auto"
    text_field: str = "text"
    glob: str | None = None
    symlinks: Literal["refuse", "follow"] = Field(
        default="refuse", description="a symlink leaving the source's root: refuse (the "
                                      "prepare fails naming it) or follow (read, its target "
                                      "recorded in the source's fingerprint)")


class NearDedupSpec(_Strict):
    """MinHash + LSH near-duplicate removal (fm_pipeline/data/near_dedup.py, docs/data.md)."""

    ngram: int = Field(default=5, gt=0, le=1024, description="words per shingle")
    bands: int = Field(default=32, gt=0, le=4096)
    rows: int = Field(default=4, gt=0, le=4096, description="signature entries per band")
    threshold: float = Field(default=0.7, gt=0, le=1,
                             description="estimated Jaccard similarity that makes a duplicate")
    seed: int = Field(default=1, ge=0, le=MAX_SEED)


class QualitySpec(_Strict):
    """Gopher and C4 heuristic filters (fm_pipeline/data/quality.py); never on code sources."""

    gopher: bool = True
    c4: bool = True
    skip_sources: list[str] = Field(default_factory=list, description="sources left unfiltered")


Band = Annotated[list[float], Field(min_length=2, max_length=2)]  # [low, high]


class CheckBands(_Strict):
    """[low, high] of each per-source share the data checks warn outside (Great
    Expectations, docs/data.md). Left out at a source: the mix-wide band."""

    dedup_ratio: Band | None = Field(default=None, description="exact duplicates / read")
    near_dedup_ratio: Band | None = Field(default=None, description="near-duplicates / read")
    quality_drop_rate: Band | None = Field(default=None,
                                           description="quality-filtered / read")

    @model_validator(mode="after")
    def _bands(self) -> "CheckBands":
        for name in ("dedup_ratio", "near_dedup_ratio", "quality_drop_rate"):
            band = getattr(self, name)
            if band is not None and not 0.0 <= band[0] <= band[1] <= 1.0:
                raise ValueError(f"{name} band {list(band)} must be [low, high] with "
                                 "0 <= low <= high <= 1")
        return self


class DataChecksSpec(CheckBands):
    """Mix-wide bands (defaults: a source listed twice, or filters wrong for it) and
    per-source overrides, e.g. a scraped source expected to be 20-40% near-duplicates."""

    dedup_ratio: Band | None = [0.0, 0.5]
    near_dedup_ratio: Band | None = [0.0, 0.5]
    quality_drop_rate: Band | None = [0.0, 0.9]
    sources: dict[str, CheckBands] = Field(default_factory=dict)


class DataSpec(_Strict):
    sources: list[SourceSpec] = Field(min_length=1)
    min_chars: int = Field(default=64, ge=0, le=MAX_COUNT)
    max_chars: int = Field(default=200_000, gt=0, le=MAX_COUNT)
    shard_tokens: int = Field(default=1 << 20, gt=0, le=MAX_COUNT)
    heldout_fraction: float = Field(default=0.02, ge=0, lt=0.5)
    seed: int = Field(default=1234, ge=0, le=MAX_SEED)
    near_dedup: NearDedupSpec | None = Field(
        default=None, description="drop documents this similar to a kept one; null: exact "
                                  "duplicates only")
    quality: QualitySpec | None = Field(default=None, description="null: no quality filters")
    mask_pii: bool = Field(default=False, description="replace e-mail and IPv4 addresses")
    checks: DataChecksSpec = Field(default_factory=DataChecksSpec,
                                   description="bands the data checks warn outside")
    task_bytes: int = Field(default=256 << 20, gt=0, le=2**50,
                            description="input bytes per cleaning task (a larger file is a "
                                        "task of its own); how the work is split, not what it makes")
    workers: int = Field(default=1, gt=0, le=256,
                         description="processes the data_mix_job run fans cleaning tasks over "
                                     "(Dagster's multiprocess executor; 1: in process)")

    @model_validator(mode="after")
    def _sources(self) -> "DataSpec":
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique; repeated: {', '.join(dupes)}")
        total = sum(s.weight for s in self.sources)
        if abs(total - 1.0) > 1e-6:
            detail = ", ".join(f"{s.name}={s.weight}" for s in self.sources)
            raise ValueError(f"source weights must sum to 1, got {total:.6g} ({detail})")
        if self.min_chars >= self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) must be < max_chars ({self.max_chars})")
        unknown = sorted(set(self.quality.skip_sources) - set(names)) if self.quality else []
        if unknown:
            raise ValueError(f"quality.skip_sources names no source: {', '.join(unknown)}")
        unknown = sorted(set(self.checks.sources) - set(names))
        if unknown:
            raise ValueError(f"checks.sources names no source: {', '.join(unknown)}")
        return self


class CheckpointSpec(_Strict):
    every_steps: int = Field(default=10, gt=0, le=MAX_STEPS)
    keep_last: int = Field(default=3, gt=0, le=10**6)
    milestone_every: int = Field(default=0, ge=0, le=MAX_STEPS, description="keep every M-th step; 0: none")
    async_save: bool = True
    upload: bool = True
    memory_every_steps: int = Field(
        default=0, ge=0, le=MAX_STEPS,
        description="fast tier: every N steps each rank snapshots its shards into node memory "
                    "(/dev/shm) with a replica on a peer node; an in-job restart restores "
                    "from it (docs/checkpoints.md, Fast tier). 0: off")


class ClusterSpec(_Strict):
    name: str = "local"
    accelerator: str = "cpu"
    gpus_per_node: int = Field(default=default("gpus_per_node"), gt=0, le=1024)
    # Left out (null): the accelerator's own figure from the catalog (fm_pipeline/
    # accelerators.py). A default here would mean one thing in a spec as written and
    # another once the spec is stored and read back.
    intra_node_gbps: float | None = Field(default=None, gt=0, description="NVLink, GB/s per "
                                          "GPU; left out: the accelerator's")
    inter_node_gbps: float | None = Field(default=None, gt=0, description="fabric, GB/s per "
                                          "GPU; left out: the accelerator's")
    oversubscription: float = Field(default=default("oversubscription"), ge=1)
    storage_write_gbps: float = Field(default=default("storage_write_gbps"), gt=0)
    storage_read_gbps: float | None = Field(
        default=default("storage_read_gbps"), gt=0, description="the store's aggregate read "
        "GB/s (the data loader's reads, restores); left out: the write bandwidth")
    dollars_per_gpu_hour: float | None = Field(default=None, ge=0, description="left out: "
                                               "the accelerator's catalog price")
    node_failure_rate_per_day: float | None = Field(
        default=None, ge=0,
        description="left out: Llama 3's interruption rates per GPU, node and job (the "
                    "planner's and the simulator's failure model); a number: failures per "
                    "node and day")
    # Planner (fm_pipeline.planner): network hierarchy above the node, restarts, storage price.
    # Every default is the one table's (fm_pipeline.cluster_defaults, `fm plan defaults`).
    nodes_per_rack: int = Field(default=default("nodes_per_rack"), gt=0, le=2**16,
                                description="nodes in one rack (failure domains)")
    fabric: Literal["rail", "tor"] = Field(
        default=default("fabric"), description="rail: NIC k of every node on leaf k "
        "(rail-optimised); tor: all of a node's NICs on its rack's switch, spine flows hashed")
    leaf_ports: int = Field(default=default("leaf_ports"), gt=0, le=2**16,
                            description="a leaf switch's down ports")
    ecmp_efficiency: float = Field(default=default("ecmp_efficiency"), gt=0, le=1,
                                   description="tor: share of a link hashed flows keep past "
                                               "their leaf")
    region_gpus: int = Field(default=default("region_gpus"), ge=0, le=MAX_COUNT,
                             description="GPUs per region; 0: one region")
    inter_region_gbps: float = Field(default=default("inter_region_gbps"), gt=0,
                                     description="GB/s per GPU between regions")
    restart_overhead_s: float = Field(default=default("restart_overhead_s"), ge=0,
                                      description="reschedule + rendezvous")
    storage_dollars_per_gb_month: float = Field(
        default=default("storage_dollars_per_gb_month"), ge=0)
    # Kubernetes
    namespace: str = "default"
    image: str = "fm-pipeline:latest"
    local_queue: str = "default"

    @model_validator(mode="after")
    def _priced(self) -> "ClusterSpec":
        if self.dollars_per_gpu_hour is None and catalog_price(self.accelerator) is None:
            raise ValueError(f"unknown accelerator {self.accelerator!r} (not in the catalog, "
                             "fm_pipeline/accelerators.py): give cluster.dollars_per_gpu_hour "
                             "and the link bandwidths, or a known accelerator")
        return self

    @property
    def price_per_gpu_hour(self) -> float:
        """dollars_per_gpu_hour, or the accelerator's catalog price when left out."""
        if self.dollars_per_gpu_hour is not None:
            return self.dollars_per_gpu_hour
        return catalog_price(self.accelerator)


class ResilienceSpec(_Strict):
    """Fault detection and straggler mitigation (fm_pipeline.resilience, docs/resilience.md)."""

    collective_timeout_s: float = Field(
        default=600.0, gt=0,
        description="a collective waiting this long for a peer fails the segment (hung rank)")
    inplace_restarts: int = Field(
        default=0, ge=0, le=1000,
        description="torchrun restarts the workers in place this many times per segment "
                    "(--max-restarts) before the segment fails to the orchestrator; each "
                    "restart restores from the fast tier when it can, else the durable one")
    inprocess_restart: bool = Field(
        default=True,
        description="on gloo, a failure that leaves every process alive restarts the segment "
                    "inside the processes first (no new workers: train/inprocess.py), within "
                    "inplace_restarts; false: every restart is torchrun's")
    lease_ttl_s: float = Field(
        default=30.0, gt=0, le=3600,
        description="the job's one-writer lease expires this long after its holder's last "
                    "renewal (renewed every third of it); a dead holder on another host is "
                    "taken over after it")
    straggler_policy: Literal["off", "report", "exclude", "drop", "auto"] = Field(
        default="report",
        description="report: events only; exclude: also checkpoint, stop and restart "
                    "without the slow rank slot / host; drop: the slow rank computes fewer "
                    "rows of each micro-batch so it keeps up (gradient rescaled, the rows "
                    "counted as lost tokens; data parallel layouts only); auto: drop, and "
                    "switch to exclude once the dropped work costs more than a relaunch "
                    "(relaunch_cost_s)")
    relaunch_cost_s: float = Field(
        default=120.0, gt=0,
        description="auto: the expected time from a straggler stop to the first resumed "
                    "step, every GPU idle (fm chaos run and benchmarks.recovery measure it)")
    straggler_window: int = Field(default=8, ge=2, le=10_000, description="gathered samples scored")
    straggler_persist: int = Field(
        default=6, ge=1, le=10_000, description="slow samples within the window that make a straggler")
    max_straggler_stops: int = Field(
        default=2, ge=0, le=10_000,
        description="exclude: stops for stragglers in the job's life (since the exclusions "
                    "were last cleared); past it the policy falls back to report and says so")
    exclusion_ttl_s: float = Field(
        default=86400.0, gt=0,
        description="an excluded slot or host is used again this long after its exclusion "
                    "(fm chaos clear-exclusions: at once)")

    @model_validator(mode="after")
    def _window(self) -> "ResilienceSpec":
        if self.straggler_persist > self.straggler_window:
            raise ValueError(f"straggler_persist ({self.straggler_persist}) must not exceed "
                             f"straggler_window ({self.straggler_window})")
        return self


class JobSpec(_Strict):
    name: str = Field(min_length=1, max_length=40)
    owner: str = "local"
    tenant: str = "default"
    priority: Priority = "normal"
    model: ModelSpec = ModelSpec()
    parallelism: ParallelismSpec = ParallelismSpec()
    training: TrainingSpec = TrainingSpec()
    data: DataSpec
    checkpoint: CheckpointSpec = CheckpointSpec()
    cluster: ClusterSpec = ClusterSpec()
    resilience: ResilienceSpec = ResilienceSpec()

    @model_validator(mode="before")
    @classmethod
    def _precision_for_the_accelerator(cls, data):
        # bf16 is what every GPU run trains in; fp32 stays the default for CPU runs, where
        # bf16 matmuls are no faster and the drills compare losses at fp32 tolerance.
        if not isinstance(data, dict):
            return data
        par, cluster = data.get("parallelism", {}), data.get("cluster", {})
        if not isinstance(par, dict) or "mixed_precision" in par or not isinstance(cluster, dict):
            return data
        accelerator = cluster.get("accelerator", "cpu")
        if not isinstance(accelerator, str) or accelerator.lower() == "cpu":
            return data
        return {**data, "parallelism": {**par, "mixed_precision": "bf16"}}

    @field_validator("name")
    @classmethod
    def _dns_name(cls, v: str) -> str:
        if not _NAME_RE.fullmatch(v):
            raise ValueError(
                f"{v!r} must be lowercase letters, digits and '-' (a Kubernetes object name)"
            )
        return v

    def renamed(self, name: str) -> "JobSpec":
        """This spec under another name, checked as a parsed name is (no second parse:
        nothing but the name changes, and every other rule held already)."""
        limit = type(self).model_fields["name"].metadata
        longest = next(m.max_length for m in limit if getattr(m, "max_length", None))
        if len(name) > longest:
            raise ValueError(f"job name {name!r} is longer than {longest} characters")
        return self.model_copy(update={"name": type(self)._dns_name(name)})

    @model_validator(mode="after")
    def _cross_field(self) -> "JobSpec":
        # Every rule that spans sections; all violations are reported together, each
        # prefixed with the field it is about (the loader splits them back out).
        problems = list(_cross_field_problems(self))
        if problems:
            raise ValueError("\n".join(f"{field}: {msg}" for field, msg in problems))
        return self

    @property
    def model_cfg(self) -> ModelConfig:
        """The resolved architecture (registry size plus overrides)."""
        return self.model.resolve()

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per dp rank per optimizer step (without pipeline parallelism)."""
        return self.training.global_batch_size // (
            self.parallelism.dp * self.training.micro_batch_size
        )

    @property
    def pp_microbatches(self) -> int:
        """Micro-batches in one pipeline schedule (= one optimizer step) per dp rank."""
        return self.training.global_batch_size // (
            self.parallelism.dp * self.training.micro_batch_size
        )

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.training.seq_len


def _cross_field_problems(job: JobSpec):
    try:
        m = job.model.resolve()
    except ValidationError as e:  # the registry size with these overrides is no model
        for err in e.errors(include_url=False):
            where = ".".join(str(p) for p in err["loc"])
            yield f"model.{where}" if where else "model", err["msg"].removeprefix(
                "Value error, ")
        return
    except ValueError as e:
        yield "model", str(e)
        return
    p, t = job.parallelism, job.training
    for field, value in (("n_heads", m.n_heads), ("n_kv_heads", m.n_kv_heads)):
        if value % p.tp:
            yield "parallelism.tp", f"model {field} ({value}) must be divisible by tp ({p.tp})"
    if m.ffn_dim % p.tp:
        yield "parallelism.tp", f"model ffn_dim ({m.ffn_dim}) must be divisible by tp ({p.tp})"
    # Tied embeddings are one matrix used by the first and the last layer: a pipeline puts
    # them on different ranks, and tensor parallelism would need two layouts of it.
    if m.tie_embeddings and p.pp > 1:
        yield "parallelism.pp", (
            f"pp {p.pp} needs untied embeddings (model tie_embeddings is true); set "
            "model.tie_embeddings: false or pp: 1")
    if m.tie_embeddings and p.tp > 1:
        yield "parallelism.tp", (
            f"tp {p.tp} needs untied embeddings (model tie_embeddings is true); set "
            "model.tie_embeddings: false or tp: 1")
    # MoE layers train under FSDP/HSDP, ep and pp so far: the tensor-parallel plan has no
    # stacked experts.
    if p.ep > 1 and not m.n_experts:
        yield "parallelism.ep", (f"ep {p.ep} needs a Mixture of Experts model; "
                                 f"{job.model.size} is dense (n_experts 0)")
    elif m.n_experts % p.ep:
        yield "parallelism.ep", (f"model n_experts ({m.n_experts}) must be divisible by "
                                 f"parallelism.ep ({p.ep})")
    if m.n_experts and p.tp > 1:
        yield "parallelism.tp", (f"tp {p.tp} with a Mixture of Experts ({job.model.size}) "
                                 "is not supported yet; use tp: 1")
    # The stacked experts are no nn.Linear for torchao to convert: they would stay bf16.
    if m.n_experts and fp8_recipe(p.mixed_precision):
        yield "parallelism.mixed_precision", (
            f"{p.mixed_precision} with a Mixture of Experts ({job.model.size}) is not "
            "supported yet (its experts would stay bf16); use bf16")
    # Compiled blocks under TP fail in backward on torch 2.13 (a DTensor redistribute gets a
    # plain tensor gradient): refused rather than discovered at the first step.
    if t.compile and p.tp > 1:
        yield "training.compile", (
            f"true does not work with parallelism.tp {p.tp} yet (the backward of compiled "
            "tensor-parallel blocks fails); set training.compile: false or parallelism.tp: 1")
    stages = p.pp * p.pp_virtual_stages
    split = p.pp_layers_per_stage
    if split is not None:
        if len(split) != stages or min(split) < 1 or sum(split) != m.n_layers:
            yield "parallelism.pp_layers_per_stage", (
                f"{split} must give each of the pp x pp_virtual_stages = {stages} stages at "
                f"least one layer, {m.n_layers} (model n_layers) in all")
    elif m.n_layers % stages:
        yield "parallelism.pp", (
            f"model n_layers ({m.n_layers}) must be divisible by pp x pp_virtual_stages "
            f"({p.pp} x {p.pp_virtual_stages} = {stages}), or give "
            "parallelism.pp_layers_per_stage"
        )
    if t.seq_len > m.max_seq_len:
        yield "training.seq_len", f"{t.seq_len} exceeds model max_seq_len ({m.max_seq_len})"
    if t.seq_len % p.tp:
        yield "training.seq_len", (
            f"{t.seq_len} must be divisible by tp ({p.tp}) for sequence parallelism"
        )
    if t.global_batch_size % p.dp:
        yield "training.global_batch_size", (
            f"{t.global_batch_size} must be divisible by dp = dp_replicate {p.dp_replicate} "
            f"x dp_shard {p.resolved_dp_shard} = {p.dp}"
        )
        return
    per_dp = t.global_batch_size // p.dp
    if per_dp % t.micro_batch_size:
        yield "training.micro_batch_size", (
            f"global_batch_size / dp = {per_dp} must be divisible by micro_batch_size "
            f"({t.micro_batch_size})"
        )
        return
    if p.pp > 1:
        n_micro = per_dp // t.micro_batch_size
        if p.pp_microbatches is not None and n_micro != p.pp_microbatches:
            yield "parallelism.pp_microbatches", (
                f"with pp > 1 one step is one pipeline schedule, so global_batch_size / dp / "
                f"micro_batch_size = {per_dp} / {t.micro_batch_size} = {n_micro} must equal "
                f"pp_microbatches ({p.pp_microbatches})"
            )
        elif n_micro < p.pp:
            yield "parallelism.pp_microbatches", f"{n_micro} must be >= pp ({p.pp})"
        elif p.pp_schedule == "Interleaved1F1B" and n_micro % p.pp:
            yield "parallelism.pp_microbatches", (
                f"Interleaved1F1B needs pp_microbatches ({n_micro}) divisible by pp ({p.pp})"
            )
    if t.warmup_steps > t.steps:
        yield "training.warmup_steps", f"{t.warmup_steps} exceeds steps ({t.steps})"
