"""Parallelism applied from outside the model: mesh, TP/SP, activation checkpointing, FSDP2,
pipeline parallelism. Entry points for the trainer, evaluation and restore drills:

    device = init_distributed()
    dims = ParallelDims.from_spec(job.parallelism, world_size=torch.distributed.get_world_size())
    mesh = dims.build_mesh(device.type)
    pm = build_parallel_model(job, mesh=mesh, dims=dims, device=device)
    pm.forward_backward(inputs, targets); pm.loss(inputs, targets)
"""

from fm_pipeline.parallel.distributed import device_and_backend, init_distributed
from fm_pipeline.parallel.parallel_dims import MESH_DIMS, ParallelDims
from fm_pipeline.parallel.parallel_model import ParallelModel, cross_entropy_loss
from fm_pipeline.parallel.parallelize import build_parallel_model, dp_mesh, parallelize_part

__all__ = [
    "MESH_DIMS", "ParallelDims", "ParallelModel", "build_parallel_model", "cross_entropy_loss",
    "device_and_backend", "dp_mesh", "init_distributed", "parallelize_part",
]
