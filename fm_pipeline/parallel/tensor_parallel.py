"""Tensor + sequence parallelism (Megatron-style) for the decoder, via parallelize_module.

Attention and SwiGLU matrices are split column-wise then row-wise, so each block needs one
all-gather before and one reduce-scatter after its two sub-layers. Between them activations
stay sharded along the sequence (Shard(1)), which also keeps norm weights on the same mesh
as everything else (clip_grad_norm_ then sees one mesh). The output projection stays
vocabulary-sharded: the loss runs under `loss_parallel()` without gathering logits.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from fm_pipeline.model import Transformer


def apply_tensor_parallel(model: Transformer, tp_mesh: DeviceMesh) -> None:
    """Shard `model` (a whole decoder or one pipeline stage of it) over `tp_mesh` in place."""
    top: dict[str, object] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
        )
    if top:
        parallelize_module(model, tp_mesh, top)

    for block in model.layers.values():
        plan = {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(
                input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
            ),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        }
        parallelize_module(block, tp_mesh, plan)

