"""Mesh arithmetic: the job's degrees, checked against the world torchrun actually started,
and the DeviceMesh built from them.

Mesh dimensions, outermost first: dp_replicate x dp_shard x pp x tp (tp innermost, so tensor
parallel peers are neighbours on a node). Every dimension exists even at degree 1, so code
can always ask for `mesh["tp"]`.

Expert parallelism (`ep` > 1) is carved out of dp_shard, as in torchtitan: the mesh is built
as dp_replicate x dp_shard_mod_ep x ep x pp x tp and dp_shard_mod_ep x ep is flattened back
into "dp_shard", so ranks keep their coordinates, everything but the experts shards over
dp_shard as before, the experts over "ep", and their FSDP over the rest ("dp_shard_mod_ep",
with dp_replicate).
"""

from __future__ import annotations

from dataclasses import dataclass

from fm_pipeline.config import ParallelismSpec

MESH_DIMS = ("dp_replicate", "dp_shard", "pp", "tp")
EP_MESH_DIMS = ("dp_replicate", "dp_shard_mod_ep", "ep", "pp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    pp: int
    tp: int
    world_size: int
    ep: int = 1

    def __post_init__(self):
        degrees = (self.dp_replicate, self.dp_shard, self.pp, self.tp, self.ep)
        if min(degrees) < 1:
            raise ValueError(f"every degree must be >= 1: {self.describe()}")
        if self.dp_shard % self.ep:
            raise ValueError(f"ep {self.ep} must divide dp_shard {self.dp_shard} (the expert-"
                             "parallel ranks are data-parallel ranks)")
        product = self.dp_replicate * self.dp_shard * self.pp * self.tp
        if product != self.world_size:
            raise ValueError(
                f"{self.describe()} = {product} does not match the world size "
                f"{self.world_size} this job was launched with"
            )

    @classmethod
    def from_spec(cls, spec: ParallelismSpec, *, world_size: int) -> "ParallelDims":
        """The degrees for the world torchrun started; a declared dp_shard of -1 takes what
        the other degrees leave of it (so a job follows an elastic world size)."""
        shard = spec.dp_shard
        if shard == -1:
            others = spec.dp_replicate * spec.pp * spec.tp
            shard = world_size // others if world_size % others == 0 else 0
        return cls(dp_replicate=spec.dp_replicate, dp_shard=shard, pp=spec.pp,
                   tp=spec.tp, world_size=world_size, ep=spec.ep)

    def describe(self) -> str:
        ep = f" (ep {self.ep} within dp_shard)" if self.ep > 1 else ""
        return (f"dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard} x pp {self.pp} "
                f"x tp {self.tp}{ep}")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.dp_replicate, self.dp_shard, self.pp, self.tp)

    @property
    def dp(self) -> int:
        """Distinct batches per step (the data loader's dp_size)."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_enabled(self) -> bool:
        return self.dp > 1

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's position on each mesh dimension (row-major over MESH_DIMS)."""
        coords, rest = {}, rank
        for name, size in reversed(list(zip(MESH_DIMS, self.shape))):
            coords[name] = rest % size
            rest //= size
        return {name: coords[name] for name in MESH_DIMS}

    def dp_rank(self, rank: int) -> int:
        c = self.coordinates(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def build_mesh(self, device_type: str):
        from torch.distributed.device_mesh import init_device_mesh

        if self.ep == 1:
            return init_device_mesh(device_type, self.shape, mesh_dim_names=MESH_DIMS)
        shape = (self.dp_replicate, self.dp_shard // self.ep, self.ep, self.pp, self.tp)
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=EP_MESH_DIMS)
        mesh["dp_shard_mod_ep", "ep"]._flatten("dp_shard")
        return mesh
