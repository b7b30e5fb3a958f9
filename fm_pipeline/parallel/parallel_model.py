"""What one rank holds after parallelisation, and the forward/backward of one optimizer step.

Without pipeline parallelism a step is a loop over micro-batches accumulating gradients;
with it, one pipeline schedule run over the whole local batch. Tensor-parallel logits stay
vocabulary-sharded and the loss runs under `loss_parallel()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from fm_pipeline.config import compute_dtype
from fm_pipeline.model import Transformer
from fm_pipeline.model.moe import expert_modules
from fm_pipeline.parallel.parallel_dims import ParallelDims


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss; logits come out bf16 under mixed precision, so upcast first."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A detached ordinary tensor (tensor-parallel losses come back as replicated DTensors)."""
    t = t.detach()
    return t.full_tensor() if isinstance(t, DTensor) else t


@dataclass
class ParallelModel:
    parts: list[Transformer]  # one, or one per virtual pipeline stage
    stages: list[int]
    n_stages: int
    schedule: object | None  # a torch.distributed.pipelining schedule when pp > 1
    dims: ParallelDims
    mesh: DeviceMesh
    device: torch.device
    mixed_precision: str
    micro_batch_size: int
    # FSDP without a pipeline: weights stay gathered and gradients unreduced until the step's
    # last micro-batch (parallelism.fsdp_keep_gathered; a pipeline schedule does it itself).
    keep_gathered: bool = False

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stages

    @property
    def has_last_stage(self) -> bool:
        """Whether this rank computes the loss."""
        return self.n_stages - 1 in self.stages

    def parameters(self) -> Iterator[nn.Parameter]:
        for part in self.parts:
            yield from part.parameters()

    def train(self, mode: bool = True) -> None:
        for part in self.parts:
            part.train(mode)

    @contextlib.contextmanager
    def _compute_context(self):
        with contextlib.ExitStack() as stack:
            if self.dims.tp > 1:
                stack.enter_context(loss_parallel())
            if compute_dtype(self.mixed_precision) == "bf16" and not self.dims.fsdp_enabled:
                # FSDP's MixedPrecisionPolicy casts when it is on; otherwise autocast does.
                stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16))
            yield

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor, *,
                         micro_batch_size: int | None = None,
                         grad_scale: float = 1.0) -> torch.Tensor | None:
        """Accumulate the gradients of one optimizer step over this rank's batch
        [local_batch, seq]. Returns the mean loss on ranks holding the last stage, else None.
        `micro_batch_size` (rows per micro-batch, default the job's) and `grad_scale` are for
        a rank computing fewer rows than its peers (the straggler drop): as many
        micro-batches, so the data-parallel collectives still match, and its gradient
        weighted by the rows it computed (the returned loss is not scaled)."""
        if self.schedule is not None:
            if micro_batch_size not in (None, self.micro_batch_size) or grad_scale != 1.0:
                raise ValueError("rows cannot be dropped under pipeline parallelism")
            loss = self._pipeline_step(inputs, targets, train=True)
            for part in self.parts:
                part.detach_moe_aux_loss()
            self._average_expert_grads()
            return loss
        model = self.parts[0]
        rows = micro_batch_size or self.micro_batch_size
        micro_inputs = inputs.split(rows)
        micro_targets = targets.split(rows)
        total = torch.zeros((), device=self.device)
        for i, (mb_inputs, mb_targets) in enumerate(zip(micro_inputs, micro_targets,
                                                        strict=True)):
            last = i == len(micro_inputs) - 1
            if self.keep_gathered and (i == 0 or last):  # set on the changes only
                model.set_requires_gradient_sync(last)  # reduce-scatter once, at the end
                model.set_reshard_after_backward(last)  # no all-gather for the next one
            with self._compute_context():
                loss = cross_entropy_loss(model(mb_inputs), mb_targets) / len(micro_inputs)
                # MoE load balancing trains beside the next-token loss (which is reported).
                aux = model.moe_aux_loss()
                objective = loss if aux is None else loss + aux / len(micro_inputs)
                (objective * grad_scale if grad_scale != 1.0 else objective).backward()
                if aux is not None:
                    model.detach_moe_aux_loss()
            total += _plain(loss)
        self._average_expert_grads()
        return total

    @torch.no_grad()
    def _average_expert_grads(self) -> None:
        """An expert-parallel expert's gradient sums what every rank of its ep group sent
        it, and FSDP averages it over the other dp_shard / ep groups only: divide by ep so
        it is the mean over all data-parallel ranks, like every other gradient."""
        if self.dims.ep == 1:
            return
        for part in self.parts:
            for experts in expert_modules(part):
                for p in experts.parameters():
                    if p.grad is not None:
                        p.grad.div_(self.dims.ep)

    @torch.no_grad()
    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Evaluation loss of one batch (no gradients); None on ranks without the last stage."""
        if self.schedule is not None:
            loss = self._pipeline_step(inputs, targets, train=False)
        else:
            with self._compute_context():
                loss = _plain(cross_entropy_loss(self.parts[0](inputs), targets))
        for part in self.parts:  # an evaluation's routing is not the next training step's
            part.take_router_stats()
        return loss

    def _pipeline_step(self, inputs, targets, *, train: bool) -> torch.Tensor | None:
        args = (inputs,) if self.has_first_stage else ()
        losses: list[torch.Tensor] = []
        kwargs = {"target": targets, "losses": losses} if self.has_last_stage else {}
        with self._compute_context():
            if train:
                self.schedule.step(*args, **kwargs)
            else:
                self.schedule.eval(*args, **kwargs)
        if not self.has_last_stage:
            return None
        return torch.stack([_plain(loss).float() for loss in losses]).mean()
