"""What a cluster is taken to be when nobody says: one table for every entry point (the job
spec's `cluster:` section, `fm plan`'s flags, the planner's API), each default with where it
comes from, and the ones nothing published backs marked as assumptions.

    fm plan defaults --gpu-type h100      # this table, with the accelerator's own figures

Bandwidths per device and the price come from the accelerator catalog
(fm_pipeline.accelerators) and are listed here by what the catalog holds; everything else
is the same for every accelerator.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Default:
    value: object  # None: the accelerator catalog's figure (see `source`)
    source: str
    assumption: bool = False  # no published figure backs it: a choice, shown as one


CATALOG = "the accelerator catalog (fm_pipeline/accelerators.py)"

CLUSTER_DEFAULTS: dict[str, Default] = {
    "gpus_per_node": Default(8, "HGX/DGX H100, H200, B200 and A100 baseboards carry 8 GPUs"),
    "intra_node_gbps": Default(None, f"{CATALOG}: NVLink per GPU and direction from the "
                               "datasheet (H100 SXM 900 GB/s both ways = 450)"),
    "inter_node_gbps": Default(None, f"{CATALOG}: one scale-out NIC per GPU (H100: ConnectX-7 "
                               "400 Gb/s = 50 GB/s, rail-optimised as in NVIDIA's DGX SuperPOD "
                               "reference architecture)"),
    "oversubscription": Default(1.0, "a non-blocking fat tree, as DGX SuperPOD's compute "
                                "fabric is built; set it for a tapered spine"),
    "fabric": Default("rail", "rail-optimised: NIC k of every node on leaf switch k, as "
                      "NVIDIA's DGX SuperPOD reference architecture cables the compute fabric "
                      "(InfiniBand, adaptive routing); 'tor': every NIC of a node on its rack's "
                      "switch, flows hashed over the spine (ECMP)"),
    "leaf_ports": Default(32, "down ports of a leaf switch: a 64-port switch (NVIDIA QM9700, "
                          "Broadcom Tomahawk 4) at 1:1, half down; a DGX SuperPOD H100 "
                          "scalable unit is 32 nodes under each rail leaf"),
    "ecmp_efficiency": Default(0.7, "share of a link a 'tor' fabric's flows keep past their "
                               "leaf when ECMP hashes elephant flows onto the same uplinks: "
                               "Baidu measured ~70 of 100 Gb/s on its AIPod RoCE fabric; one "
                               "operator's figure", assumption=True),
    "nodes_per_rack": Default(4, "4 nodes in a rack (a DGX H100 draws up to 10.2 kW: a "
                              "~40 kW rack holds 4): the rack as a failure domain; which "
                              "nodes one switch joins is `fabric` and `leaf_ports`",
                              assumption=True),
    "region_gpus": Default(0, "one region: the whole cluster in one building"),
    "inter_region_gbps": Default(2.5, "20 Gb/s per GPU between buildings; no published figure",
                                 assumption=True),
    "storage_write_gbps": Default(10.0, "a modest shared filesystem's share for one job; Meta's "
                                  "Tectonic sustained 2 TB/s for Llama 3 (Llama 3 paper, "
                                  "section 3.3.4): set yours, it moves goodput by points",
                                  assumption=True),
    "storage_read_gbps": Default(None, "the write bandwidth, unless given"),
    "host_copy_gbps": Default(25.0, "half of PCIe Gen5 x16's 64 GB/s per direction for a "
                              "device-to-host copy of an async save", assumption=True),
    "checkpoint_store_share": Default(0.5, "a policy: half of the store's writes for this "
                                      "job's saves, the rest for reads, restores, other jobs"),
    "dollars_per_gpu_hour": Default(None, f"{CATALOG}: an indicative on-demand list price",
                                    assumption=True),
    "storage_dollars_per_gb_month": Default(0.023, "Amazon S3 Standard's list price, first "
                                            "50 TB a month (us-east-1)"),
    "node_failure_rate_per_day": Default(None, "Llama 3 405B's 419 interruptions in 54 days on "
                                         "16,384 H100, per GPU, node and job (Table 5; "
                                         "planner.failure_model)"),
    "failure_rate_scale": Default(1.0, "the failure model as published"),
    "restart_overhead_s": Default(600.0, "reschedule, rendezvous, NCCL init of a large job, "
                                  "restore excluded; unpublished (Llama 3's > 90% effective "
                                  "time needs <= ~300 s: docs/calibration-simulation.md)",
                                  assumption=True),
    "node_swap_s": Default(60.0, "a hot spare joining in place of a lost node; unpublished",
                           assumption=True),
    "fast_tier_survivable": Default(None, "per failure mode, from what each leaves behind "
                                    "(planner.failure_model.NOT_FAST_SURVIVABLE): the reading "
                                    "of Table 5 into kinds is ours", assumption=True),
    "inplace_restart_s": Default(60.0, "an in-job restart of a large job (benchmarks.recovery "
                                 "measures 0.6-7 s on 2-core nodes, not a thousand nodes)",
                                 assumption=True),
}


def default(name: str):
    """The default value of cluster field `name` (KeyError: not a cluster field)."""
    return CLUSTER_DEFAULTS[name].value
