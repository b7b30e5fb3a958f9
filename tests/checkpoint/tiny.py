"""A tiny language model and training state for checkpoint tests (in-process and torchrun).

Layers live in a ModuleDict (as in fm_pipeline's Transformer) so FQNs stay global when a
pipeline stage drops some of them.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fm_pipeline.checkpoint import LRSchedulerState, ModelState, OptimizerState
from fm_pipeline.config import parse_job

VOCAB, DIM, SEQ = 64, 32, 8


def tiny_job(name: str = "ckpt-test", *, dim: int = 64, parallelism: dict | None = None,
             **checkpoint):
    """A valid JobSpec; its model section only has to match between save and restore."""
    return parse_job({
        "name": name,
        "model": {"size": "debug", "dim": dim},
        "parallelism": parallelism or {},
        "training": {"seq_len": SEQ, "global_batch_size": 4, "micro_batch_size": 1},
        "data": {"sources": [{"name": "a", "uri": "x", "weight": 1.0}]},
        "checkpoint": {"every_steps": 1, "keep_last": 10, "upload": False, **checkpoint},
    })


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = nn.Linear(DIM, DIM)

    def forward(self, x):
        return x + torch.tanh(self.ff(x))


class TinyLM(nn.Module):
    def __init__(self, n_layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(n_layers)})
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.out(h)


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def batch(step: int, rank: int = 0, size: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (size, SEQ + 1), generator=g)


class Cursor:
    """Stands in for the data loader: a global sample position, the same on every rank."""

    def __init__(self):
        self.samples_consumed = 0

    def state_dict(self):
        return {"samples_consumed": self.samples_consumed}

    def load_state_dict(self, sd):
        self.samples_consumed = int(sd["samples_consumed"])


class Trainer:
    """Model, AdamW, LR schedule and cursor wired into the checkpoint's app state."""

    def __init__(self, model: nn.Module, *, seed_batches: int = 0):
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: 1.0 / (1 + s))
        self.cursor = Cursor()
        self.app_state = {
            "model": ModelState([model]),
            "optimizer": OptimizerState([model], [self.opt]),
            "lr_scheduler": LRSchedulerState(self.sched),
            "dataloader": self.cursor,
        }

    def step(self, step: int, rank: int = 0) -> float:
        loss = loss_of(self.model, batch(step, rank))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        self.cursor.samples_consumed += 4
        return float(loss.detach())
