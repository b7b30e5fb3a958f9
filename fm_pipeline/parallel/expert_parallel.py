"""Expert parallelism: each MoE layer's stacked experts sharded over the `ep` mesh dimension,
token rows sent to the rank holding their expert and back with `all_to_all_single`.

The EP ranks are data-parallel ranks (ep is carved out of dp_shard, as in torchtitan): each
routes its own tokens, the router and everything else stay FSDP-sharded over all of
dp_shard, and the experts are FSDP-sharded over what remains (dp_shard / ep, and
dp_replicate). Per MoE layer and forward:

1. the counts per expert are exchanged (an all-to-all of E integers), so every rank knows
   how many rows it sends to and receives from each peer;
2. the rows, grouped by expert (MoEFeedForward sorts them), go to their experts' rank;
3. the received rows, ordered by source rank then local expert, are regrouped by local
   expert; the experts run; the rows go back in the order they came (the combine).

Both all-to-alls are autograd functions: backward sends the gradients along the reverse
path. Works on gloo (CPU) and NCCL.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from fm_pipeline.model import Transformer


class ExpertParallel(ParallelStyle):
    """Shards a GroupedExperts module along its experts and wraps it with the dispatch and
    combine (one instance per module: it keeps the splits of the forward in flight)."""

    def __init__(self):
        super().__init__()
        self.send_splits: list[int] = []
        self.recv_splits: list[int] = []
        self.regroup: torch.Tensor | None = None

    def _partition(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for param_name, param in list(module.named_parameters(recurse=False)):
            sharded = nn.Parameter(distribute_tensor(param, mesh, [Shard(0)]))
            module.register_parameter(param_name, sharded)

    def _dispatch(self, module: nn.Module, inputs: tuple, mesh: DeviceMesh):
        rows, counts = inputs  # counts: rows per expert, all E of them
        ep = mesh.size()
        group = mesh.get_group()
        local_experts = counts.shape[0] // ep
        with torch.no_grad():
            # [ep x local_experts]: what each source rank sends to each of this rank's experts.
            received = all_to_all_single(counts, None, None, group=group)
            received = torch.ops._c10d_functional.wait_tensor(received).view(ep, local_experts)
            self.send_splits = counts.view(ep, local_experts).sum(1).tolist()
            self.recv_splits = received.sum(1).tolist()
            # Received rows come source-major; the experts want them expert-major.
            source_of_row = torch.arange(ep * local_experts, device=counts.device)
            segment = torch.repeat_interleave(source_of_row, received.reshape(-1))
            source, expert = segment // local_experts, segment % local_experts
            self.regroup = torch.argsort(expert * ep + source, stable=True)
        rows = all_to_all_single_autograd(rows, self.recv_splits, self.send_splits, group)
        return rows[self.regroup], received.sum(0)

    def _combine(self, module: nn.Module, out: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        back = torch.empty_like(out).index_copy(0, self.regroup, out) if out.shape[0] else out
        return all_to_all_single_autograd(back, self.send_splits, self.recv_splits,
                                          mesh.get_group())

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, partition_fn=self._partition,
                                 input_fn=self._dispatch, output_fn=self._combine)


def apply_expert_parallel(model: Transformer, ep_mesh: DeviceMesh) -> None:
    """Shard every MoE layer's experts of `model` over `ep_mesh`, in place."""
    for moe in model.moe_layers():
        n = moe.cfg.n_experts
        if n % ep_mesh.size():
            raise ValueError(f"n_experts {n} is not divisible by ep {ep_mesh.size()}")
        ExpertParallel()._apply(moe.experts, ep_mesh)
