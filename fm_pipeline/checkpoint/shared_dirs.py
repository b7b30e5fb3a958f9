"""Which ranks share a local checkpoint directory: one node, a shared filesystem, or nodes
with their own disks.

    copies = discover_copies(root)     # collective; trivial without torch.distributed
    copies.shared                      # every rank sees the same directory
    copies.leader                      # this rank does its copy's directory work
    copies.key                         # the same for ranks that share a directory

With one node or a shared filesystem there is one copy and rank 0 leads it: commit,
retention and downloads happen once. When nodes have their own disks each node's directory
holds the files its ranks wrote; the lowest rank of each copy prepares its directory, keeps a
copy of the manifest there, prunes it like rank 0 prunes its own, and fetches from the store
the files its ranks need to restore. Discovery is a probe, not a guess from hostnames: rank 0
creates a file in `root` and every rank looks for it.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.checkpoint import comm

RANK0_COPY = "rank0"


@dataclass(frozen=True)
class Copies:
    keys: tuple[str, ...]  # per rank: which copy of the directory it sees
    rank: int = 0

    @property
    def key(self) -> str:
        return self.keys[self.rank]

    @property
    def shared(self) -> bool:
        return len(set(self.keys)) == 1

    @property
    def leader(self) -> bool:
        return self.keys.index(self.key) == self.rank

    @property
    def count(self) -> int:
        return len(set(self.keys))


SINGLE = Copies(keys=(RANK0_COPY,))


def discover_copies(root: str | Path, group=None) -> Copies:
    """Collective over `group` (default: the world): every rank looks for a file rank 0
    just created in `root`."""
    if not comm.initialized():
        return SINGLE
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    token = comm.broadcast_from_rank0(uuid.uuid4().hex if comm.rank() == 0 else None, group)
    probe = root / f".fm-copy-{token}.tmp"
    if comm.rank() == 0:
        probe.touch()
    comm.barrier(group)
    if probe.exists():
        key = RANK0_COPY
    else:
        st = os.stat(root)
        key = f"{socket.gethostname()}:{st.st_dev}:{st.st_ino}"
    keys = tuple(comm.all_gather(key, group))
    if comm.rank() == 0:
        probe.unlink(missing_ok=True)
    return Copies(keys=keys, rank=comm.rank())
