"""The resumable data-parallel loader over a mix's global sample index.

    loader = MixLoader(mix, dp_rank=r, dp_size=dp, micro_batch_size=mbs,
                       global_batch_size=gbs, seq_len=job.training.seq_len)
    for step, batch in zip(range(start_step, end_step), loader):   # LongTensor [gbs//dp, seq_len+1]
        inputs, targets = batch[:, :-1], batch[:, 1:]
        for micro in loader.micro_batches(batch): ...
    ckpt["dataloader"] = loader.state_dict()     # {"samples_consumed": ..., ...}

Step k (counted from the state) gives rank r the global samples
`[consumed + k*gbs + r*gbs/dp, consumed + k*gbs + (r+1)*gbs/dp)`. The state is the number of
global samples consumed, so a loader restored at another dp size (or global batch size)
continues the exact same global sequence. A background thread prefetches `prefetch` steps
ahead; errors raised there (a corrupted shard) surface on the next `next()`. On a remote
store it also asks the mix to fetch, speculatively, the shards of the `shard_lookahead`
steps after those (Mix.prefetch_samples): a shard's download then overlaps the steps
before the one that reads it instead of stalling that step.
"""

from __future__ import annotations

import queue
import threading

import torch

from fm_pipeline.data.errors import DataError
from fm_pipeline.data.mix import Mix

_STOP = object()


class MixLoader:
    def __init__(
        self,
        mix: Mix,
        *,
        dp_rank: int,
        dp_size: int,
        micro_batch_size: int,
        global_batch_size: int,
        seq_len: int,
        split: str = "train",
        prefetch: int = 2,
        shard_lookahead: int = 8,
    ):
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank must be in [0, dp_size); got dp_rank={dp_rank} dp_size={dp_size}")
        if global_batch_size % dp_size:
            raise ValueError(
                f"global_batch_size ({global_batch_size}) must be divisible by dp_size ({dp_size})"
            )
        per_rank = global_batch_size // dp_size
        if micro_batch_size < 1 or per_rank % micro_batch_size:
            raise ValueError(
                f"global_batch_size / dp_size = {per_rank} must be divisible by "
                f"micro_batch_size ({micro_batch_size})"
            )
        if seq_len != mix.seq_len:
            raise DataError(
                f"loader seq_len {seq_len} differs from mix {mix.key}'s seq_len {mix.seq_len}; "
                "the mix key includes training.seq_len, so prepare the mix for this job"
            )
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if shard_lookahead < 0:
            raise ValueError(f"shard_lookahead must be >= 0, got {shard_lookahead}")
        self.mix = mix
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.micro_batch_size, self.global_batch_size = micro_batch_size, global_batch_size
        self.per_rank = per_rank
        self.split = split
        self.prefetch = prefetch
        self.shard_lookahead = shard_lookahead if split == "train" else 0
        self.samples_consumed = 0
        self._queue: queue.Queue | None = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        if split == "heldout":
            self._heldout = [(s, mix.heldout_windows(s)) for s in mix.source_names]

    # --- iteration ----------------------------------------------------------------------

    def __iter__(self) -> "MixLoader":
        return self

    def __next__(self) -> torch.Tensor:
        if self._thread is None:
            self._start()
        item = self._queue.get()
        if item is _STOP:
            self._thread = None
            raise StopIteration
        if isinstance(item, BaseException):
            self._thread = None
            raise item
        batch, consumed_after = item
        self.samples_consumed = consumed_after
        return batch

    def micro_batches(self, batch: torch.Tensor) -> list[torch.Tensor]:
        """Split one step's rank-local batch into gradient-accumulation micro-batches."""
        return list(batch.split(self.micro_batch_size))

    @property
    def step_samples(self) -> tuple[int, int]:
        """Global sample range [start, end) this rank receives on the next step."""
        start = self.samples_consumed + self.dp_rank * self.per_rank
        return start, start + self.per_rank

    # --- checkpoint state (the "dataloader" Stateful part) -------------------------------

    def state_dict(self) -> dict:
        return {
            "samples_consumed": self.samples_consumed,
            "mix_key": self.mix.key,
            "global_batch_size": self.global_batch_size,
            "split": self.split,
        }

    def load_state_dict(self, state: dict) -> None:
        if "samples_consumed" not in state:
            raise ValueError(f"loader state has no samples_consumed: {sorted(state)}")
        key = state.get("mix_key", self.mix.key)
        if key != self.mix.key:
            raise DataError(
                f"checkpointed loader read mix {key}, this job's mix is {self.mix.key}; "
                "resuming would change the data stream"
            )
        consumed = int(state["samples_consumed"])
        if consumed < 0:
            raise ValueError(f"samples_consumed must be >= 0, got {consumed}")
        self.close()
        self.samples_consumed = consumed

    # --- background prefetch -------------------------------------------------------------

    def close(self) -> None:
        """Stop the prefetch thread; the next `next()` restarts it from `samples_consumed`."""
        if self._thread is not None:
            self._stop.set()
            while self._thread.is_alive():
                try:  # unblock a producer waiting on a full queue
                    self._queue.get_nowait()
                except queue.Empty:
                    self._thread.join(timeout=0.05)
        self._thread = self._queue = self._stop = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _start(self) -> None:
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._produce, args=(self.samples_consumed, self._queue, self._stop),
            name=f"mix-loader-dp{self.dp_rank}", daemon=True,
        )
        self._thread.start()

    def _speculate(self, consumed: int, steps: range) -> None:
        """Ask the mix for the shards of this rank's samples `steps` steps after `consumed`."""
        for k in steps:
            start = consumed + k * self.global_batch_size + self.dp_rank * self.per_rank
            self.mix.prefetch_samples(start, self.per_rank)

    def _produce(self, consumed: int, out: queue.Queue, stop: threading.Event) -> None:
        try:
            speculate = self.shard_lookahead and self.mix.remote
            if speculate:
                self._speculate(consumed, range(1, self.shard_lookahead + 1))
            while not stop.is_set():
                if speculate:
                    self._speculate(consumed, range(self.shard_lookahead,
                                                    self.shard_lookahead + 1))
                start = consumed + self.dp_rank * self.per_rank
                if self.split == "train":
                    rows = self.mix.samples(start, self.per_rank)
                elif consumed + self.global_batch_size > sum(n for _, n in self._heldout):
                    _put(out, _STOP, stop)
                    return
                else:
                    rows = self._heldout_rows(start, self.per_rank)
                consumed += self.global_batch_size
                if not _put(out, (torch.from_numpy(rows), consumed), stop):
                    return
        except BaseException as e:  # handed to the consumer, raised by next()
            _put(out, e, stop)

    def _heldout_rows(self, start: int, count: int):
        """Held-out split as one finite sequence: every source's windows, in mix order."""
        import numpy as np

        parts, pos = [], start
        for source, n in self._heldout:
            if count and pos < n:
                take = min(count, n - pos)
                parts.append(self.mix.heldout_samples(source, pos, take))
                count -= take
                pos = 0
            else:
                pos -= n
        return np.concatenate(parts)


def _put(out: queue.Queue, item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False
