"""Build the model this rank trains: meta-device construction, then parallelism applied from
outside in a fixed order, then materialisation and deterministic initialisation.

    from fm_pipeline.parallel import build_parallel_model, init_distributed, ParallelDims
    device = init_distributed()
    dims = ParallelDims.from_spec(job.parallelism, world_size=dist.get_world_size())
    mesh = dims.build_mesh(device.type)
    pm = build_parallel_model(job, mesh=mesh, dims=dims, device=device)
    loss = pm.forward_backward(inputs, targets)      # grads accumulated for one step

Order per model part: FP8 linear layers (`mixed_precision: fp8-*`, parallel/float8.py) ->
tensor/sequence or expert parallel -> activation checkpointing -> compile (per
block, `training.compile`) -> FSDP2 (torchtitan's order: FSDP must wrap what TP produced,
and checkpointing must sit inside FSDP so recomputation re-gathers nothing; compile sees the
TP-sharded block and leaves FSDP's hooks eager). Pipeline parallelism decides first which
parts (stages) this rank holds.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor

from fm_pipeline.config import JobSpec, fp8_recipe
from fm_pipeline.model import Transformer
from fm_pipeline.parallel.activation_checkpoint import apply_activation_checkpoint
from fm_pipeline.parallel.compile import apply_compile, check_compile_toolchain
from fm_pipeline.parallel.expert_parallel import apply_expert_parallel
from fm_pipeline.parallel.float8 import apply_float8
from fm_pipeline.parallel.fsdp import apply_fsdp
from fm_pipeline.parallel.parallel_dims import ParallelDims
from fm_pipeline.parallel.parallel_model import ParallelModel, cross_entropy_loss
from fm_pipeline.parallel.pipeline_parallel import build_stage_module, stage_ids
from fm_pipeline.parallel.tensor_parallel import apply_tensor_parallel


def dp_mesh(mesh: DeviceMesh, dims: ParallelDims) -> DeviceMesh:
    """The mesh FSDP works on: 2-D (replicate, shard) for HSDP, else the shard dimension."""
    if dims.dp_replicate > 1:
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp_shard"]


def expert_dp_mesh(mesh: DeviceMesh, dims: ParallelDims) -> DeviceMesh | None:
    """The mesh FSDP shards expert-parallel experts over (what dp_shard leaves beside ep, and
    dp_replicate); None without expert parallelism (the experts shard like the rest)."""
    if dims.ep == 1:
        return None
    if dims.dp_replicate > 1:
        return mesh["dp_replicate", "dp_shard_mod_ep"]
    return mesh["dp_shard_mod_ep"]


def parallelize_part(
    part: Transformer,
    *,
    mesh: DeviceMesh,
    dims: ParallelDims,
    activation_checkpoint: str,
    mixed_precision: str,
    compile: bool = False,
    keep_gathered: bool = False,
) -> None:
    """FP8 linears -> TP / EP -> AC -> compile -> FSDP2 on one model part, in place."""
    if recipe := fp8_recipe(mixed_precision):
        apply_float8(part, recipe=recipe, fsdp=dims.fsdp_enabled)
    if dims.tp > 1:
        apply_tensor_parallel(part, mesh["tp"])
    if dims.ep > 1:
        apply_expert_parallel(part, mesh["ep"])
    apply_activation_checkpoint(part, activation_checkpoint)
    if compile:
        apply_compile(part)
    if dims.fsdp_enabled:
        apply_fsdp(part, dp_mesh(mesh, dims), mixed_precision=mixed_precision,
                   reshard_after_forward=dims.pp == 1 and not keep_gathered,
                   expert_mesh=expert_dp_mesh(mesh, dims))


def write_local_part(param: nn.Parameter, full: torch.Tensor) -> None:
    """Keep the slice of `full` that this rank's shard of `param` holds."""
    if isinstance(param, DTensor):
        local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(local.to_local())
    else:
        param.copy_(full)


def build_parallel_model(
    job: JobSpec,
    *,
    mesh: DeviceMesh,
    dims: ParallelDims,
    device: torch.device,
    seed: int | None = None,
) -> ParallelModel:
    """This rank's parallelised, initialised model parts (and pipeline schedule if pp > 1)."""
    cfg, p = job.model_cfg, job.parallelism
    n_stages = p.pp * p.pp_virtual_stages
    pp_rank = mesh["pp"].get_local_rank()
    stages = stage_ids(pp_rank=pp_rank, pp=p.pp, virtual_stages=p.pp_virtual_stages)
    if job.training.compile:
        check_compile_toolchain(device)
    parts = []
    for stage in stages:
        with torch.device("meta"):
            part = build_stage_module(cfg, stage=stage, n_stages=n_stages,
                                      split=p.pp_layers_per_stage)
        parallelize_part(part, mesh=mesh, dims=dims, activation_checkpoint=p.activation_checkpoint,
                         mixed_precision=p.mixed_precision, compile=job.training.compile,
                         keep_gathered=p.fsdp_keep_gathered)
        if p.pp > 1:  # the schedule's loss sees the last stage only (moe.py says how)
            for moe in part.moe_layers():
                moe.aux_loss_in_backward = True
        part.to_empty(device=device)
        part.init_weights(seed=job.training.seed if seed is None else seed, write=write_local_part)
        parts.append(part)
    schedule = None
    if p.pp > 1:
        from fm_pipeline.parallel.pipeline_schedule import build_schedule  # ~1.7 s to import

        schedule = build_schedule(
            parts, stages=stages, n_stages=n_stages, schedule=p.pp_schedule,
            n_microbatches=job.pp_microbatches, loss_fn=cross_entropy_loss, device=device,
            pp_group=mesh["pp"].get_group(),
        )
    return ParallelModel(
        parts=parts, stages=stages, n_stages=n_stages, schedule=schedule, dims=dims, mesh=mesh,
        device=device, mixed_precision=p.mixed_precision,
        micro_batch_size=job.training.micro_batch_size,
        keep_gathered=p.fsdp_keep_gathered and dims.fsdp_enabled and p.pp == 1,
    )
