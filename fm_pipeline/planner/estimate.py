"""One plan, fully predicted: memory, step time, MFU/HFU, where the time goes, checkpoint
interval, goodput, time-to-train, dollars, and where the ranks go.

    from fm_pipeline.planner import Layout, estimate, make_cluster, named_shape
    est = estimate(named_shape("llama3-405b", seq_len=8192), make_cluster("h100"),
                   Layout(tp=8, pp=16, dp=128, virtual_stages=4, recompute="half"),
                   global_batch_tokens=16 * 2**20, training_tokens=15.6e12)
    est.to_dict()["mfu"], est.to_dict()["fits"]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fm_pipeline.planner.cluster import ClusterConfig
from fm_pipeline.planner.cost import Cost, training_cost
from fm_pipeline.planner.data_reads import DataReads, data_reads
from fm_pipeline.planner.errors import require_positive
from fm_pipeline.planner.evidence import high_mfu_flag, uncertainty_pts
from fm_pipeline.planner.layout import Candidates, Layout, check_layout
from fm_pipeline.planner.placement import Placement, placement
from fm_pipeline.planner.precision import check_supported, get_precision
from fm_pipeline.planner.prediction import plan_metrics
from fm_pipeline.planner.reliability import Reliability, TwoLevel, reliability, two_level
from fm_pipeline.planner.runnable import model_not_runnable, not_runnable
from fm_pipeline.planner.shape import ModelShape
from fm_pipeline.planner.step import evaluate

CHINCHILLA_TOKENS_PER_PARAM = 20  # default budget when none is given (Hoffmann et al. 2022)


@dataclass
class Estimate:
    shape: ModelShape
    cluster: ClusterConfig
    layout: Layout
    global_batch_tokens: int
    metrics: dict
    reliability: Reliability
    cost: Cost
    placement: Placement
    warnings: list[str] = field(default_factory=list)
    fast_tier: TwoLevel | None = None  # the in-memory tier's plan next to the durable one
    data: DataReads | None = None  # the loader's reads against the store
    precision: str = "bf16"  # of the matmuls (planner.precision); MFU against BF16's peak for FP8

    @property
    def fits(self) -> bool:
        return self.metrics["fits"]

    def to_dict(self) -> dict:
        """Flat headline numbers first (the `fm plan estimate --json` contract), then sections."""
        p = self.shape.params()
        lay = self.layout
        return {
            **{k: v for k, v in self.metrics.items() if not isinstance(v, dict)},
            "model": self.shape.name,
            "params": p.total,
            "model_flops_per_token": self.shape.model_flops_per_token(),
            "gpus": lay.gpus,
            "gpu_type": self.cluster.accelerator.name,
            "precision": self.precision,
            "global_batch_tokens": self.global_batch_tokens,
            "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp,
                       "micro_batch": lay.micro_batch, "virtual_stages": lay.virtual_stages,
                       "schedule": lay.pipeline_schedule, "recompute": lay.recompute,
                       "sharding": lay.sharding, "dp_shard": lay.shard_group, "ep": lay.ep},
            "time_s": self.metrics["time_s"],
            "memory_gib": self.metrics["memory_gib"],
            "groups_reach": self.metrics["groups_reach"],
            "reliability": self.reliability.to_dict(),
            "fast_tier": self.fast_tier.to_dict() if self.fast_tier else None,
            "data_reads": self.data.to_dict() if self.data else None,
            "cost": self.cost.to_dict(),
            "placement": self.placement.to_dict(),
            "warnings": self.warnings,
        }


def estimate(shape: ModelShape, cluster: ClusterConfig, layout: Layout, *, global_batch_tokens: int,
             training_tokens: float | None = None, precision: str = "bf16", dp_overlap: bool = True,
             ep_overlap: bool | str = "none", sequence_parallel: bool = True,
             tp_overlap: bool = True, async_checkpoint: bool = True,
             checkpoints_kept: int = 3) -> Estimate:
    require_positive("global_batch_tokens", global_batch_tokens, integer=True)
    if training_tokens is not None:
        require_positive("training_tokens", training_tokens)
    prec = get_precision(precision)
    check_supported(prec, cluster.accelerator)
    precision = prec.name
    check_layout(shape, layout, gpus=layout.gpus, global_batch_tokens=global_batch_tokens)
    candidates = Candidates.from_layouts([layout])
    ev = evaluate(
        shape,
        cluster,
        candidates,
        global_batch_tokens=global_batch_tokens,
        precision=precision,
        dp_overlap=dp_overlap,
        ep_overlap=ep_overlap,
        sequence_parallel=sequence_parallel,
        tp_overlap=tp_overlap,
    )
    metrics = plan_metrics(ev, 0)
    metrics["mfu_uncertainty_pts"] = float(
        uncertainty_pts(candidates, gpus_per_node=cluster.gpus_per_node)[0])
    params = shape.params().total
    rel = reliability(
        params=params,
        gpus=layout.gpus,
        cluster=cluster,
        step_time_s=metrics["step_time_s"],
        async_save=async_checkpoint,
    )
    tokens = training_tokens or CHINCHILLA_TOKENS_PER_PARAM * params
    cost = training_cost(
        training_tokens=tokens,
        tokens_per_step=global_batch_tokens,
        step_time_s=metrics["step_time_s"],
        gpus=layout.gpus,
        cluster=cluster,
        reliability=rel,
        checkpoints_kept=checkpoints_kept,
    )
    place = placement(cluster, layout)
    warnings = list(place.notes)
    if not metrics["fits"]:
        warnings.append(
            f"does not fit: {metrics['memory_gib_per_gpu']:.1f} GiB needed per GPU, "
            f"{metrics['memory_capacity_gib']:.0f} GiB available; add pp or tp, shard "
            "more (ddp -> fsdp), or recompute activations"
        )
    warnings += [f"not runnable by the trainer: {why}"
                 for why in not_runnable(shape, layout, precision=precision,
                                         ep_overlap=ep_overlap)]
    if why := model_not_runnable(shape):
        warnings.append(why)
    if flag := high_mfu_flag(metrics["mfu"], dense=not shape.experts, precision=precision):
        warnings.append(flag)
    reads = data_reads(shape, cluster, tokens_per_s=metrics["tokens_per_s"])
    if reads.share > 1:
        warnings.append(f"the data loader would stall: {reads.describe()} "
                        "(cluster.storage_read_gbps)")
    if layout.recompute == "selective" and shape.flash_attention:
        warnings.append(
            "selective recomputation saves nothing with flash attention "
            "(no attention scores are stored); it only adds recompute time"
        )
    return Estimate(
        shape=shape,
        cluster=cluster,
        layout=layout,
        global_batch_tokens=global_batch_tokens,
        metrics=metrics,
        reliability=rel,
        cost=cost,
        placement=place,
        warnings=warnings,
        fast_tier=two_level(params=params, gpus=layout.gpus, cluster=cluster,
                            step_time_s=metrics["step_time_s"], durable=rel),
        precision=precision,
        data=reads,
    )
