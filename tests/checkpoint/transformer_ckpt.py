"""A checkpoint of fm_pipeline's own Transformer with a probe batch and its loss, for
restore-drill tests: written in this process (a world of one), or under torchrun with any
parallelism (e.g. pp 2, for a pp -> dp drill):

    torchrun --standalone --nproc-per-node 2 -m tests.checkpoint.transformer_ckpt ROOT pp=2
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from fm_pipeline.checkpoint import CheckpointManager, ModelState, OptimizerState, Probe
from fm_pipeline.config import parse_job
from tests.checkpoint.tiny import Cursor
from tests import local_site

SEQ, GBS = 32, 4


def drill_job(name: str = "drill-test", **parallelism):
    return parse_job({
        "name": name,
        "model": {"size": "debug", "n_layers": 2},
        "parallelism": parallelism,
        "training": {"seq_len": SEQ, "global_batch_size": GBS, "micro_batch_size": 2},
        "data": {"sources": [{"name": "a", "uri": "x", "weight": 1.0}]},
        "checkpoint": {"upload": False},
    })


class Counters:
    """train_state stand-in: the trainer's step and token counters."""

    def __init__(self):
        self.step, self.tokens_seen = 0, 0

    def state_dict(self):
        return {"step": self.step, "tokens_seen": self.tokens_seen}

    def load_state_dict(self, sd):
        self.step, self.tokens_seen = int(sd["step"]), int(sd["tokens_seen"])


@contextlib.contextmanager
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def write_checkpoint(steps: int = 2, *, root=None):
    """Train `steps` steps on random tokens in this process and save the last; the
    SaveResult."""
    with world_of_one():
        return train_and_save(drill_job(), steps, root=root)


def train_and_save(job, steps: int, *, root=None):
    """Every rank: build the job's parallel model, train on random tokens, save the last
    step with a probe batch whose loss every rank agrees on."""
    from fm_pipeline.parallel import ParallelDims, build_parallel_model

    dims = ParallelDims.from_spec(job.parallelism, world_size=dist.get_world_size())
    mesh = dims.build_mesh("cpu")
    pm = build_parallel_model(job, mesh=mesh, dims=dims, device=torch.device("cpu"))
    optims = [torch.optim.AdamW(p.parameters(), lr=1e-3) for p in pm.parts]
    cursor, counters = Cursor(), Counters()
    app_state = {"model": ModelState(pm.parts), "optimizer": OptimizerState(pm.parts, optims),
                 "dataloader": cursor, "train_state": counters}
    manager = CheckpointManager(job, app_state, mesh=mesh, async_save=True, root=root, site=local_site.site())
    g = torch.Generator().manual_seed(0)
    vocab = job.model_cfg.vocab_size
    for step in range(1, steps + 1):
        tokens = torch.randint(0, vocab, (GBS, SEQ + 1), generator=g)
        pm.forward_backward(tokens[:, :-1], tokens[:, 1:])
        for opt in optims:
            opt.step()
            opt.zero_grad()
        cursor.samples_consumed += GBS
        counters.step, counters.tokens_seen = step, counters.tokens_seen + GBS * SEQ
    probe = torch.randint(0, vocab, (2, SEQ + 1), generator=g)
    loss = pm.loss(probe[:, :-1], probe[:, 1:])  # None on ranks without the last stage
    total = torch.tensor([float(loss) if loss is not None else 0.0, float(loss is not None)],
                         dtype=torch.float64)
    dist.all_reduce(total)
    manager.save(steps, tokens_seen=counters.tokens_seen,
                 probe=Probe(probe, float(total[0] / total[1])), final=True)
    return manager.close()


if __name__ == "__main__":
    import os
    import sys
    from pathlib import Path

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo")
    degrees = dict(arg.split("=") for arg in sys.argv[2:])
    job = drill_job(nproc_per_node=dist.get_world_size(),
                    **{k: int(v) for k, v in degrees.items()})
    train_and_save(job, 2, root=Path(sys.argv[1]))
    dist.destroy_process_group()
