"""One rank's training machinery: parallel model, optimizers, LR schedule, data loader, train
state, and the optimizer step with its timings.

A step, as measured:
    data_wait        next(loader)                                    (rank-local)
    compute          forward/backward of all micro-batches (or the pipeline schedule)
    collective_wait  one all-reduce of [loss, has_loss, preempt]: a rank that finished its
                     backward early waits here for the slowest one; it also makes every
                     rank agree on the loss and on whether to stop after this step
    compute (cont.)  grad norm (float64) + clipping + optimizer + LR schedule

Straggler drop (resilience.straggler_policy drop/auto, data-parallel layouts): rank 0 puts a
row plan (rows per micro-batch for every dp rank) into that all-reduce; from the next step
each rank computes only its planned rows of each micro-batch (as many micro-batches as its
peers, so FSDP's collectives still match) and scales its gradient by dp * rows / sum(rows),
which makes the averaged gradient the mean over the rows actually computed. The rows not
computed are lost tokens (StepResult.tokens_dropped), not seen ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from fm_pipeline.checkpoint import LRSchedulerState, ModelState, OptimizerState, Probe
from fm_pipeline.config import JobSpec
from fm_pipeline.parallel import ParallelDims, build_parallel_model
from fm_pipeline.train.faults import (
    FAIL_AT_ENV,
    InjectedFault,
    injected_failure_step,
    slow_rank_delay,
)
from fm_pipeline.train.grad_norm import clip_grads_, global_grad_norm
from fm_pipeline.train.optimizer import build_lr_scheduler, build_optimizer
from fm_pipeline.train.state import TrainState, layout_key


@dataclass
class StepResult:
    step: int
    loss: float
    grad_norm: float
    lr: float
    data_wait_s: float
    compute_s: float
    collective_wait_s: float
    step_time_s: float
    stop_requested: bool  # some rank asked to stop (preemption) before this step's sync
    peak_memory_gib: float | None  # accelerator memory high-water mark of this step (GPU)
    process_cpu_s: float  # CPU time of this process (all threads) during the step
    work_fraction: float = 1.0  # rows this rank computed / rows of its batch (drop)
    rows_s: float = 0.0  # forward/backward alone: the part that scales with the rows
    tokens_dropped: int = 0  # tokens of this step's global batch no rank computed (drop)
    router: dict | None = None  # MoE: expert load imbalance, dropped token-slots (all ranks)


def drop_capable(dims: ParallelDims) -> bool:
    """Rows can be dropped where every rank's batch is its own: no tp (ranks of a tp group
    share their inputs) and no pp (the schedule fixes the micro-batch shape)."""
    return dims.tp == 1 and dims.pp == 1


def job_topology(job: JobSpec, world_size: int) -> str:
    p = job.parallelism
    return layout_key(p, world_size=world_size, dp_shard=p.resolved_dp_shard)


class Trainer:
    def __init__(self, job: JobSpec, *, dims: ParallelDims, mesh: DeviceMesh,
                 device: torch.device, rank: int, mix):
        from fm_pipeline.data import MixLoader

        self.job, self.dims, self.mesh, self.device, self.rank = job, dims, mesh, device, rank
        t = job.training
        self.pm = build_parallel_model(job, mesh=mesh, dims=dims, device=device)
        self.params = list(self.pm.parameters())
        self.optimizers = [build_optimizer(part, t) for part in self.pm.parts]
        self.schedulers = [build_lr_scheduler(opt, t) for opt in self.optimizers]
        self.mix = mix
        self.dp_rank = dims.dp_rank(rank)
        self.loader = MixLoader(mix, dp_rank=self.dp_rank, dp_size=dims.dp,
                                micro_batch_size=t.micro_batch_size,
                                global_batch_size=t.global_batch_size, seq_len=t.seq_len)
        self.state = TrainState(rank=rank, topology=job_topology(job, dims.world_size),
                                seed=t.seed, device=device)
        self.state.reseed()
        self.app_state = {
            "model": ModelState(self.pm.parts),
            "optimizer": OptimizerState(self.pm.parts, self.optimizers),
            "lr_scheduler": LRSchedulerState(self.schedulers),
            "dataloader": self.loader,
            "train_state": self.state,
        }
        self.pp_group = mesh["pp"].get_group() if dims.pp > 1 else None
        self.slow_rank_delay = slow_rank_delay(rank)
        self.fail_after_step = injected_failure_step(rank)
        # The drop's row plan: slots in the step's all-reduce (none unless the policy can
        # drop), the plan in force, and (rank 0) the plan asked for from the next step.
        drops = job.resilience.straggler_policy in ("drop", "auto")
        self.plan_slots = dims.dp if drops and drop_capable(dims) else 0
        self.row_plan: list[int] | None = None
        self.next_row_plan: list[int] | None = None
        self._probe_tokens: torch.Tensor | None = None

    def step(self, *, stop_requested: bool) -> StepResult:
        """One optimizer step on this rank; every rank must call it."""
        if self.fail_after_step is not None and self.state.step == self.fail_after_step:
            raise InjectedFault(f"injected fault ({FAIL_AT_ENV}): rank {self.rank} fails after "
                                f"step {self.state.step}")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        t0, cpu0 = time.perf_counter(), time.process_time()
        batch = next(self.loader).to(self.device, non_blocking=True)
        t1 = time.perf_counter()
        full = self.job.training.micro_batch_size
        rows = self.row_plan[self.dp_rank] if self.row_plan else full
        computed = sum(self.row_plan) / (full * len(self.row_plan)) if self.row_plan else 1.0
        if rows < full:  # this rank's planned rows of each micro-batch
            batch = batch.view(-1, full, batch.shape[-1])[:, :rows].reshape(-1, batch.shape[-1])
        loss = self.pm.forward_backward(
            batch[:, :-1], batch[:, 1:], micro_batch_size=rows,
            grad_scale=rows / (full * computed) if self.row_plan else 1.0)
        if self.slow_rank_delay:  # a slow device: its delay scales with the rows it computes
            time.sleep(self.slow_rank_delay * rows / full)
        self._sync_device()
        t2 = time.perf_counter()
        ask = (self.next_row_plan or [0] * self.plan_slots) if self.rank == 0 else \
            [0] * self.plan_slots
        router = RouterLoads.take(self.pm.parts)  # MoE: summed with the same sync
        moe = router.packed() if router else []
        packed = torch.tensor(
            [0.0 if loss is None else float(loss), 0.0 if loss is None else 1.0,
             1.0 if stop_requested else 0.0, *map(float, ask), *map(float, moe)],
            dtype=torch.float64, device=self.device)
        dist.all_reduce(packed)
        loss_sum, n_loss, stops, *rest = packed.tolist()
        plan, moe = rest[:len(ask)], rest[len(ask):]
        loads = None
        if moe:  # per MoE layer, over every rank: the balancing bias moves the same everywhere
            loads = router.update_bias(moe)
        t3 = time.perf_counter()
        grad_norm = global_grad_norm(self.params, pp_group=self.pp_group)
        clip_grads_(self.params, max_norm=self.job.training.grad_clip, total_norm=grad_norm)
        lr = self.schedulers[0].get_last_lr()[0]
        for opt in self.optimizers:
            opt.step()
        for sched in self.schedulers:
            sched.step()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        grad_norm_value = grad_norm.item()  # also waits for the device
        t4 = time.perf_counter()
        self.state.step += 1
        tokens = round(self.job.tokens_per_step * computed)
        self.state.tokens_seen += tokens
        # The plan rank 0 asked for applies from the next step (every rank read it here).
        self.row_plan = [int(r) for r in plan] if plan and any(
            0 < r < full for r in plan) else None
        return StepResult(
            step=self.state.step, loss=loss_sum / max(n_loss, 1.0), grad_norm=grad_norm_value,
            lr=lr, data_wait_s=t1 - t0, compute_s=(t2 - t1) + (t4 - t3),
            collective_wait_s=t3 - t2, step_time_s=t4 - t0, stop_requested=stops > 0,
            peak_memory_gib=(torch.cuda.max_memory_allocated(self.device) / 2**30
                             if self.device.type == "cuda" else None),
            process_cpu_s=time.process_time() - cpu0, work_fraction=rows / full,
            rows_s=t2 - t1,
            tokens_dropped=self.job.tokens_per_step - tokens,
            router=_router_summary([sum(e) for e in zip(*loads)], moe[-1]) if moe else None)

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- the probe batch the restore drill re-evaluates ---------------------------------

    def probe(self) -> Probe | None:
        """A fixed held-out batch (dp rank 0's first) and the current model's loss on it.
        Collective: every rank evaluates the same batch. None if the mix has no held-out data."""
        if self._probe_tokens is None:
            self._probe_tokens = self._first_heldout_batch()
        if self._probe_tokens.numel() == 0:
            return None
        tokens = self._probe_tokens.to(self.device)
        loss = self.pm.loss(tokens[:, :-1], tokens[:, 1:])
        packed = torch.tensor([0.0 if loss is None else float(loss),
                               0.0 if loss is None else 1.0], dtype=torch.float64,
                              device=self.device)
        dist.all_reduce(packed)
        return Probe(self._probe_tokens, packed[0].item() / packed[1].item())

    def _first_heldout_batch(self) -> torch.Tensor:
        from fm_pipeline.data import MixLoader

        t = self.job.training
        heldout = MixLoader(self.mix, dp_rank=0, dp_size=self.dims.dp,
                            micro_batch_size=t.micro_batch_size,
                            global_batch_size=t.global_batch_size, seq_len=t.seq_len,
                            split="heldout", prefetch=1)
        try:
            return next(heldout)
        except StopIteration:
            return torch.empty(0, dtype=torch.int64)
        finally:
            heldout.close()

    def close(self) -> None:
        self.loader.close()


@dataclass
class RouterLoads:
    """This rank's token-slots per expert of every MoE layer of the model, laid out by the
    layer's place in the whole model (zeros for the layers other pipeline stages hold), and
    its dropped slots: summed over the world, each layer's slots are those of every rank
    that holds it, whatever the pipeline split."""

    parts: list
    moe_ids: list[int]  # the model's MoE layers, in order
    width: int  # experts per layer
    loads: list[list[int]]
    dropped: int

    @classmethod
    def take(cls, parts: list) -> RouterLoads | None:
        cfg = parts[0].cfg
        if not cfg.n_experts:  # a dense model: nothing to count, every step
            return None
        moe_ids = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
        loads = [[0] * cfg.n_experts for _ in moe_ids]
        dropped = 0
        for part in parts:
            taken = part.take_router_stats()
            if taken is None:  # a stage without MoE layers
                continue
            for layer, load in zip(part.moe_layer_ids(), taken[0], strict=True):
                loads[moe_ids.index(layer)] = load
            dropped += taken[1]
        return cls(parts, moe_ids, cfg.n_experts, loads, dropped)

    def packed(self) -> list[float]:
        return [*(float(n) for layer in self.loads for n in layer), float(self.dropped)]

    def update_bias(self, summed: list[float]) -> list[list[float]]:
        """Each part's layers' balancing bias from the world's sum (`packed` all-reduced);
        returns every layer's summed load."""
        loads = [summed[i:i + self.width] for i in range(0, len(summed) - 1, self.width)]
        for part in self.parts:
            ids = part.moe_layer_ids()
            if ids:
                part.update_router_bias([loads[self.moe_ids.index(i)] for i in ids])
        return loads


def _router_summary(load: list[float], dropped: float) -> dict:
    """How evenly the step's token-slots spread over the experts (max / mean load: 1 is
    perfect balance) and how many were dropped at capacity, over all ranks and layers."""
    mean = sum(load) / len(load)
    return {"moe_max_load": round(max(load) / mean, 4) if mean else None,
            "moe_dropped_slots": int(dropped), "moe_slots": int(sum(load))}
