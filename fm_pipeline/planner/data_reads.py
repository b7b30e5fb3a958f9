"""The data loader's reads against the store: the training's token rate times the bytes a
token takes in the shards, beside what the store can read (cluster.storage_read_gbps, the
write bandwidth unless given).

    reads = data_reads(shape, cluster, tokens_per_s=2.3e6)
    reads.share   # > 1: the store cannot feed the GPUs; the loader stalls the steps

Pretraining reads each token about once (an epoch or less), so a node's cache of shards it
has read does not cut the demand; what the loader's prefetch hides is the store's latency,
not its bandwidth (benchmarks.remote_data measures that). The shards hold token ids as
uint16 up to a 65,536-token vocabulary, uint32 above (fm_pipeline.data.manifest).
"""

from __future__ import annotations

from dataclasses import dataclass

from fm_pipeline.planner.cluster import ClusterConfig
from fm_pipeline.planner.shape import ModelShape


def token_bytes(vocab: int) -> int:
    from fm_pipeline.data.manifest import token_dtype

    return 2 if token_dtype(vocab) == "uint16" else 4


@dataclass(frozen=True)
class DataReads:
    needed_gbps: float  # what the training reads, GB/s over the whole job
    available_gbps: float  # what the store reads

    @property
    def share(self) -> float:
        """The share of the store's read bandwidth the loader needs (> 1: it stalls)."""
        return self.needed_gbps / self.available_gbps

    def describe(self) -> str:
        return f"the steps read {_rate(self.needed_gbps)} of tokens, the store reads " \
               f"{_rate(self.available_gbps)}"

    def to_dict(self) -> dict:
        return {"needed_gbps": self.needed_gbps, "available_gbps": self.available_gbps,
                "share": self.share}


def data_reads(shape: ModelShape, cluster: ClusterConfig, *, tokens_per_s: float) -> DataReads:
    # +1 token per sequence: the loader reads the next-token target past each window.
    per_token = token_bytes(shape.vocab) * (shape.seq_len + 1) / shape.seq_len
    return DataReads(needed_gbps=tokens_per_s * per_token / 1e9,
                     available_gbps=cluster.restore_gbps)


def _rate(gbps: float) -> str:
    return f"{gbps:.2f} GB/s" if gbps >= 1 else f"{gbps * 1e3:.1f} MB/s"
