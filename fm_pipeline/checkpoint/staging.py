"""Staging: copying the state to host memory, so training can go on while it is written.

Two modes:
  blocking  the copy happens inside save(); the loop is blocked for the whole memcpy.
  overlap   save() only starts the copy (a background thread) and returns; the next
            forward/backward runs meanwhile, and each optimizer's step() first waits for the
            copy to finish (a step pre-hook), because the optimizer is what mutates the saved
            tensors in place. The loop is blocked only for what is left of the copy then.

On a GPU the copy is device-to-host; on a CPU it is a memcpy that competes with compute for
the same cores (the benchmark reports that slowdown). Overlap assumes nothing but the hooked
optimizers writes to saved tensors between save() and the next optimizer step.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait

from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from fm_pipeline.checkpoint.comm import single_threaded

log = logging.getLogger(__name__)


class HostStager:
    def __init__(self, *, mode: str, optimizers: list):
        if mode not in ("overlap", "blocking"):
            raise ValueError(f"staging must be 'overlap' or 'blocking', got {mode!r}")
        if mode == "overlap" and not optimizers:
            log.info("no optimizers to guard: staging blocks inside save()")
            mode = "blocking"
        self.mode = mode
        # Staged buffers are cached and reused across saves (at most one save in flight).
        self._stager = DefaultStager(StagingOptions(
            use_pinned_memory=False, use_shared_memory=False, use_async_staging=False,
            use_non_blocking_copy=False))
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fm-ckpt-stage",
                                          initializer=single_threaded)
        self._pending: Future | None = None
        self._wait_s = 0.0
        self._hooks = [opt.register_step_pre_hook(self._before_optimizer_step)
                       for opt in optimizers] if mode == "overlap" else []

    def stage(self, state: dict) -> Future:
        """A future of the host copy (already done in blocking mode)."""
        if self.mode == "overlap":
            self._pending = self._thread.submit(self._stager.stage, state)
            return self._pending
        done: Future = Future()
        done.set_result(self._stager.stage(state))
        return done

    def _before_optimizer_step(self, optimizer, args, kwargs) -> None:
        pending = self._pending
        if pending is None:
            return
        if not pending.done():
            t0 = time.perf_counter()
            wait([pending])  # a staging error surfaces in the save's result, not here
            self._wait_s += time.perf_counter() - t0
        self._pending = None

    def take_wait_s(self) -> float:
        """Seconds optimizer steps spent waiting for the copy since the last call."""
        waited, self._wait_s = self._wait_s, 0.0
        return waited

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._thread.shutdown(wait=True)
        self._stager.close()
