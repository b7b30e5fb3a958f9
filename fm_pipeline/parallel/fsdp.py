"""FSDP2 (`fully_shard`): each transformer block is one unit, then the rest of the model.

On a 1-D mesh it shards (ZeRO-3); on the 2-D ("dp_replicate", "dp_shard") mesh it is HSDP:
sharded within a replica group, gradients all-reduced across replicas. bf16 mixed precision
computes in bf16 and reduces gradients in fp32; master weights and optimizer state stay fp32.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from fm_pipeline.config import compute_dtype
from fm_pipeline.model import Transformer
from fm_pipeline.model.moe import expert_modules


def mixed_precision_policy(mixed_precision: str) -> MixedPrecisionPolicy:
    if compute_dtype(mixed_precision) == "bf16":  # FP8 runs are bf16 runs with FP8 GEMMs
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(
    model: Transformer,
    dp_mesh: DeviceMesh,
    *,
    mixed_precision: str,
    reshard_after_forward: bool,
    expert_mesh: DeviceMesh | None = None,
) -> None:
    """Shard `model` in place. Pipeline stages and `fsdp_keep_gathered` pass
    reshard_after_forward=False: re-gathering the weights for every microbatch's backward
    would multiply the all-gathers. With expert parallelism each MoE layer's experts are
    their own unit on `expert_mesh`."""
    policy = mixed_precision_policy(mixed_precision)
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # The last block's weights are needed again at once by backward: keep them.
        reshard = reshard_after_forward and i < len(blocks) - 1
        # (found by type: activation checkpointing or compile may have wrapped the block)
        for experts in (expert_modules(block) if expert_mesh is not None else []):
            fully_shard(experts, mesh=expert_mesh, mp_policy=policy,
                        reshard_after_forward=reshard)
        fully_shard(block, mesh=dp_mesh, mp_policy=policy,
                    reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
