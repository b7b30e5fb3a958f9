"""The cluster as the planner sees it: accelerator, the network hierarchy, storage, prices,
failure rate.

    from fm_pipeline.planner.cluster import make_cluster
    cluster = make_cluster("h100", gpus_per_node=8, inter_node_gbps=50, region_gpus=32768)

Network hierarchy, fastest first: the node (NVLink, `intra_node_gbps` per GPU and
direction); the leaf, the nodes one switch hop apart (each GPU has its own NIC,
`inter_node_gbps` per GPU); the spine (traffic leaving a leaf is slowed by
`oversubscription`); other regions or buildings (`region_gpus` GPUs per region, at
`inter_region_gbps` per GPU). Bandwidths left out come from the accelerator catalog.

How far one hop reaches depends on the cabling (`fabric`). Rail-optimised, NIC k of every
node goes to leaf k, so a leaf of `leaf_ports` down ports joins that many nodes (NCCL moves
other GPUs' traffic onto the right rail over NVLink first). Top-of-rack, all of a node's
NICs go to one switch, which joins `leaf_ports / gpus_per_node` nodes, and the spine's
flows are hashed (ECMP): colliding elephant flows keep `ecmp_efficiency` of a link.
`nodes_per_rack` is the physical rack (failure domains, the rank table).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fm_pipeline.accelerators import Accelerator, get_accelerator
from fm_pipeline.cluster_defaults import CLUSTER_DEFAULTS, default
from fm_pipeline.planner.errors import PlanInputError, require_positive
from fm_pipeline.planner.failure_model import FailureMix, llama3_failure_mix, node_failure_mix

FABRICS = ("rail", "tor")


@dataclass(frozen=True)
class ClusterConfig:
    accelerator: Accelerator
    gpus_per_node: int
    intra_node_gbps: float  # NVLink, GB/s per GPU per direction
    inter_node_gbps: float  # scale-out NIC, GB/s per GPU per direction (rails)
    # Every default below is the one table's (fm_pipeline.cluster_defaults: each with its
    # source, `fm plan defaults`), the job spec's `cluster:` section's too.
    oversubscription: float = default("oversubscription")  # spine taper leaving a leaf
    fabric: str = default("fabric")  # rail | tor: how far one switch hop reaches
    leaf_ports: int = default("leaf_ports")  # a leaf switch's down ports
    ecmp_efficiency: float = default("ecmp_efficiency")  # tor: past the leaf, hashed flows
    nodes_per_rack: int = default("nodes_per_rack")
    region_gpus: int = default("region_gpus")  # GPUs per region; 0: one region
    inter_region_gbps: float = default("inter_region_gbps")  # GB/s per GPU between regions
    storage_write_gbps: float = default("storage_write_gbps")  # aggregate checkpoint GB/s
    storage_read_gbps: float | None = default("storage_read_gbps")  # None: as write
    host_copy_gbps: float = default("host_copy_gbps")  # device-to-host per GPU (async save)
    # Share of the store's write bandwidth one job's checkpoints may take on average.
    checkpoint_store_share: float = default("checkpoint_store_share")
    dollars_per_gpu_hour: float = 2.5  # make_cluster fills in the catalog's price
    storage_dollars_per_gb_month: float = default("storage_dollars_per_gb_month")
    # None: Llama 3's interruption rates per GPU, node and job (planner.failure_model, the
    # simulator's too); a number: that many failures per node and day, nothing else.
    node_failure_rate_per_day: float | None = default("node_failure_rate_per_day")
    failure_rate_scale: float = default("failure_rate_scale")  # what-if: x2, x0.5
    restart_overhead_s: float = default("restart_overhead_s")  # excl. the restore
    node_swap_s: float = default("node_swap_s")  # a hot spare joining for a lost node
    # The fast tier: the share of failures it survives (None: per failure mode, from what
    # each leaves behind; a number: that share of all of them) and its in-job restart's
    # cost without the restore.
    fast_tier_survivable: float | None = default("fast_tier_survivable")
    inplace_restart_s: float = default("inplace_restart_s")

    def __post_init__(self) -> None:
        require_positive("gpus_per_node", self.gpus_per_node, integer=True)
        require_positive("nodes_per_rack", self.nodes_per_rack, integer=True)
        require_positive("leaf_ports", self.leaf_ports, integer=True)
        if self.fabric not in FABRICS:
            raise PlanInputError("fabric", f"must be one of {', '.join(FABRICS)}, got "
                                 f"{self.fabric!r}")
        if not 0 < self.ecmp_efficiency <= 1:
            raise PlanInputError("ecmp_efficiency",
                                 f"must be within (0, 1], got {self.ecmp_efficiency}")
        for field in ("intra_node_gbps", "inter_node_gbps", "inter_region_gbps",
                      "storage_write_gbps", "host_copy_gbps"):
            require_positive(field, getattr(self, field))
        if self.storage_read_gbps is not None:
            require_positive("storage_read_gbps", self.storage_read_gbps)
        if self.oversubscription < 1:
            raise PlanInputError(
                "oversubscription", f"must be >= 1 (1 = non-blocking), got {self.oversubscription}"
            )
        if self.region_gpus < 0:
            raise PlanInputError(
                "region_gpus", f"must be >= 0 (0: one region), got {self.region_gpus}"
            )
        for field in (
            "dollars_per_gpu_hour",
            "storage_dollars_per_gb_month",
            "node_failure_rate_per_day",
            "failure_rate_scale",
            "restart_overhead_s",
            "inplace_restart_s",
            "node_swap_s",
        ):
            if getattr(self, field) is not None and getattr(self, field) < 0:
                raise PlanInputError(field, f"must be >= 0, got {getattr(self, field)}")
        if not 0 < self.checkpoint_store_share <= 1:
            raise PlanInputError("checkpoint_store_share", "must be within (0, 1], got "
                                 f"{self.checkpoint_store_share}")
        if self.fast_tier_survivable is not None and not 0 <= self.fast_tier_survivable <= 1:
            raise PlanInputError("fast_tier_survivable",
                                 f"must be within [0, 1], got {self.fast_tier_survivable}")

    def failures_per_day(self, gpus: int) -> float:
        """Unplanned interruptions per day of a job on `gpus` of this cluster."""
        return self.failure_mix(gpus).per_day

    def failure_mix(self, gpus: int) -> FailureMix:
        """The job's failures: how many, how many the fast tier survives, how long each
        takes to notice and how many wait for a node swap (the simulator's modes, in
        expectation)."""
        if self.node_failure_rate_per_day is None:
            mix = llama3_failure_mix(n_gpus=gpus, gpus_per_node=self.gpus_per_node)
        else:
            mix = node_failure_mix(-(-gpus // self.gpus_per_node) * self.node_failure_rate_per_day,
                                   n_gpus=gpus, gpus_per_node=self.gpus_per_node)
        mix = replace(mix, per_day=mix.per_day * self.failure_rate_scale)
        if self.fast_tier_survivable is not None:
            mix = replace(mix, fast_share=self.fast_tier_survivable)
        return mix

    @property
    def gpus_per_leaf(self) -> int:
        """GPUs one switch hop apart: a rail leaf joins one NIC of each of `leaf_ports`
        nodes, a top-of-rack switch all of each node's NICs."""
        nodes = self.leaf_ports if self.fabric == "rail" else max(
            1, self.leaf_ports // self.gpus_per_node)
        return nodes * self.gpus_per_node

    @property
    def spine_share(self) -> float:
        """The share of a NIC's rate a flow keeps past its leaf."""
        hashed = self.ecmp_efficiency if self.fabric == "tor" else 1.0
        return hashed / self.oversubscription

    @property
    def restore_gbps(self) -> float:
        return self.storage_read_gbps or self.storage_write_gbps

    def with_changes(self, **changes) -> ClusterConfig:
        return replace(self, **changes)


def cpu_per_rank(ranks_per_node: int) -> Accelerator:
    """The CPU entry as one of `ranks_per_node` torchrun workers sees it: launchers give each
    worker cores // ranks threads, and the trainer measures its peak with that many. Without
    torch (a control-side image) the whole machine is measured and shared out evenly."""
    import os
    from dataclasses import replace

    from fm_pipeline.accelerators import measured_cpu
    from fm_pipeline.cpu_peaks import has_torch

    if not has_torch():
        whole = measured_cpu()
        return replace(whole, name=f"cpu-{ranks_per_node}r",
                       peak_bf16_flops=whole.peak_bf16_flops / ranks_per_node,
                       peak_fp32_flops=whole.peak_fp32_flops / ranks_per_node)
    # Known per host once measured (fm_pipeline.cpu_peaks): torch is imported only to probe.
    return measured_cpu(max(1, (os.cpu_count() or 1) // ranks_per_node))


def make_cluster(gpu_type: str, **overrides) -> ClusterConfig:
    """A cluster of `gpu_type`; any field left out (or None) takes the catalog's value."""
    fields = {k: v for k, v in overrides.items() if v is not None}
    fields.setdefault("gpus_per_node", default("gpus_per_node"))
    try:
        if gpu_type.lower() == "cpu":
            require_positive("gpus_per_node", fields["gpus_per_node"], integer=True)
            acc = cpu_per_rank(fields["gpus_per_node"])
        else:
            acc = get_accelerator(gpu_type)
    except ValueError as e:
        if isinstance(e, PlanInputError):
            raise
        raise PlanInputError("gpu_type", str(e)) from None
    fields.setdefault("intra_node_gbps", acc.intra_node_gbps)
    fields.setdefault("inter_node_gbps", acc.inter_node_gbps)
    fields.setdefault("dollars_per_gpu_hour", acc.dollars_per_hour)
    return ClusterConfig(accelerator=acc, **fields)


def cluster_from_spec(spec, *, gpus_per_node: int | None = None) -> ClusterConfig:
    """The planner's cluster for a job's `cluster:` section.

    Bandwidths and price the job spec leaves out (null) come from the accelerator catalog,
    as on the command line. `gpus_per_node` defaults to the spec's value.
    """
    overrides = {
        "gpus_per_node": gpus_per_node or spec.gpus_per_node,
        "oversubscription": spec.oversubscription,
        "storage_write_gbps": spec.storage_write_gbps,
        "node_failure_rate_per_day": spec.node_failure_rate_per_day,
    }
    for field, spec_field in (
        ("intra_node_gbps", "intra_node_gbps"),
        ("inter_node_gbps", "inter_node_gbps"),
        ("dollars_per_gpu_hour", "dollars_per_gpu_hour"),
        ("storage_read_gbps", "storage_read_gbps"),
    ):
        if getattr(spec, spec_field) is not None:
            overrides[field] = getattr(spec, spec_field)
    for field in (
        "nodes_per_rack",
        "fabric",
        "leaf_ports",
        "ecmp_efficiency",
        "region_gpus",
        "inter_region_gbps",
        "restart_overhead_s",
        "storage_dollars_per_gb_month",
    ):
        overrides[field] = getattr(spec, field)
    return make_cluster(spec.accelerator, **overrides)


def cluster_defaults(gpu_type: str) -> list[dict]:
    """Every field a cluster description may leave out: its value on `gpu_type` (the
    catalog's figures filled in, as make_cluster and a job spec's `cluster:` section do),
    where it comes from, and whether nothing published backs it."""
    cluster = make_cluster(gpu_type)
    return [{"field": name, "value": getattr(cluster, name), "source": d.source,
             "assumption": d.assumption} for name, d in CLUSTER_DEFAULTS.items()]
