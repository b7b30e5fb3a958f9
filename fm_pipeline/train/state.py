"""The "train_state" checkpoint part: step, tokens seen, and each rank's RNG state.

DCP keeps one copy of a plain (non-DTensor) entry per key, so per-rank RNG states are keyed
by global rank ("rng.rank3"). They only mean something for the same topology: restoring a
checkpoint written under another mesh skips them (`restoring_from`), and each rank reseeds
from (seed, step, rank) instead, which keeps resharded resumes deterministic.
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.checkpoint.stateful import Stateful

from fm_pipeline.catalog.topology import layout_key, topology_key  # noqa: F401 (re-exported)


class TrainState(Stateful):
    def __init__(self, *, rank: int, topology: str, seed: int, device: torch.device):
        self.rank = rank
        self.topology = topology
        self.seed = seed
        self.device = device
        self.step = 0
        self.tokens_seen = 0
        self.rng_restored = False
        self._with_rng = True  # False only while restoring from another topology

    @contextlib.contextmanager
    def restoring_from(self, checkpoint_topology: str | None):
        """Around a restore: ask for RNG states only from a checkpoint of this very topology
        (DCP plans a load from the keys state_dict() returns)."""
        self._with_rng = checkpoint_topology == self.topology
        try:
            yield
        finally:
            self._with_rng = True  # saves always carry this rank's RNG

    def _rng_key(self, kind: str) -> str:
        return f"{kind}.rank{self.rank}"

    def state_dict(self) -> dict:
        sd = {"step": self.step, "tokens_seen": self.tokens_seen, "topology": self.topology}
        if self._with_rng:
            sd[self._rng_key("rng")] = torch.get_rng_state()
            if self.device.type == "cuda":
                sd[self._rng_key("cuda_rng")] = torch.cuda.get_rng_state(self.device)
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        self.step = int(state_dict["step"])
        self.tokens_seen = int(state_dict["tokens_seen"])
        key = self._rng_key("rng")
        if self._with_rng and key in state_dict:
            torch.set_rng_state(state_dict[key].cpu())
            cuda_key = self._rng_key("cuda_rng")
            if self.device.type == "cuda" and cuda_key in state_dict:
                torch.cuda.set_rng_state(state_dict[cuda_key].cpu(), self.device)
            self.rng_restored = True
        else:
            self.reseed()

    def reseed(self) -> None:
        """Deterministic per-rank RNG for a fresh start or a resharded resume."""
        torch.manual_seed(self.seed * 1_000_003 + self.step * 65_537 + self.rank)
