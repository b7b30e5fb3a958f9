"""The key that says how a run placed its ranks, torch-free: the trainer writes it into each
checkpoint (train_state.topology) and the validator checks a manifest's claimed layout
against it."""

from __future__ import annotations


def topology_key(*, world_size: int, degrees: dict[str, int | str]) -> str:
    """A string that is equal exactly when two runs place ranks identically."""
    return f"world{world_size}:" + ",".join(f"{k}{v}" for k, v in sorted(degrees.items()))


def layout_key(p, *, world_size: int, dp_shard: int) -> str:
    """topology_key of a parallelism record (a job spec's, or a checkpoint manifest's)."""
    degrees = dict(dp_replicate=p.dp_replicate, dp_shard=dp_shard, pp=p.pp, tp=p.tp,
                   pp_virtual_stages=p.pp_virtual_stages)
    if getattr(p, "ep", 1) > 1:  # (only then: dense runs keep the keys their checkpoints hold)
        degrees["ep"] = p.ep
    split = getattr(p, "pp_layers_per_stage", None)
    if split:  # an uneven pipeline split is another layout of the same degrees
        degrees["pp_layers"] = "-".join(map(str, split))
    return topology_key(world_size=world_size, degrees=degrees)
