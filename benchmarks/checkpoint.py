"""Checkpoint save/load throughput against the raw disk, and what an async save costs training.

    python -m benchmarks.checkpoint [--model wide|20m|...] [--repeats 5] [--write-threads 2]

One process stands for one rank: fm_pipeline's Transformer trained on random tokens. The
default "wide" shape (2 layers, dim 1024, ~29M parameters, ~350 MB of model + AdamW state)
has tensors of 4-16 MB like a rank's shards of a large model; registry sizes such as "20m"
(~230 MB in 375 tensors of ~0.6 MB) show the per-tensor overhead of DCP instead. Baselines
are measured in the same run, interleaved with the measured operation so both see the same
machine noise (medians):

  save_bytes_per_s        a sync save: state_dict + DCP write (CRC32C computed and writeback
                          started as the bytes stream out) + fsync + manifest
  disk_read_bytes_per_s   the raw file read back with its page cache dropped (fadvise), in
                          8 MB reads into one reused buffer
  load_bytes_per_s        restore with the checkpoint's page cache dropped the same way: one
                          read of each file into the model's tensors, CRC32C of those bytes
  disk_write_streamed_bytes_per_s  the like-for-like write baseline: the same bytes written
                          the way the checkpoint writes them (HashingFile without a
                          checksum: direct I/O from two aligned 16 MB buffers where the
                          filesystem has it, else 16 MB pieces with writeback and
                          drop-behind), + fsync
  save_ratio_streamed     save_bytes_per_s / disk_write_streamed_bytes_per_s: the headline
  async_block_s           loop blocked by an async save: save() call + the optimizer step's
                          wait for the overlapped host copy (staging)
  stall_ratio             async_block_s / sync_save_s
  following_steps_extra_s extra time of the training steps that ran while the background
                          write was in flight, vs steps without a save (2 cores are shared)
  async_total_ratio       (async_block_s + following_steps_extra_s) / sync_save_s: what an
                          async save really costs training, against a sync save
  sync_save_cpu_s         CPU seconds (all threads) of a sync save: the work an async save
                          moves onto cores that training uses when none is spare

Targets: save_ratio_streamed and load_ratio >= 0.8, stall_ratio <= 0.03, async_total_ratio
< 1 (an async save must cost training less than a sync one). Ratios are medians of the
per-repeat ratios (each repeat measures both sides back to back), with their spread
(max - min) beside them. Last stdout line: JSON.

Two more baselines explain the ratios (they are not what the targets are measured against):
  disk_write_bytes_per_s  one file of the checkpoint's byte count: one write() + fsync (the
                          page cache takes the whole file first; save_ratio is against it)
  disk_read_into_place_bytes_per_s the raw cold read into one buffer of the full byte count
                          (pre-faulted, like a model's tensors): a restore has to put every
                          byte somewhere, the 8 MB reused buffer of the baseline does not;
                          load_ratio_in_place is the restore against it
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tests import local_site

SAVE_TARGET, LOAD_TARGET, STALL_TARGET, ASYNC_TOTAL_TARGET = 0.8, 0.8, 0.03, 1.0
WIDE = {"size": "small", "n_layers": 2, "dim": 1024, "n_heads": 8, "n_kv_heads": 8,
        "ffn_dim": 2048, "vocab_size": 4096}


def _drop_cache(path: Path) -> None:
    """Evict a file's clean pages, so the next read comes from the disk (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _raw_write(path: Path, payload: memoryview) -> float:
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        f.write(payload)
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def _raw_write_streamed(path: Path, payload: memoryview, piece: int = 16 << 20) -> float:
    from fm_pipeline.checkpoint.writer import HashingFile

    t0 = time.perf_counter()
    stream = HashingFile(path, algorithm=None, writeback_bytes=piece)
    for at in range(0, len(payload), piece):
        stream.write(payload[at:at + piece])
    stream.close()
    return time.perf_counter() - t0


def _raw_read(path: Path, into: bytearray | None = None) -> float:
    """Cold read in 8 MB pieces: into one reused buffer, or in place into `into`."""
    _drop_cache(path)
    buf = memoryview(bytearray(8 << 20) if into is None else into)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        at = 0
        while n := f.readinto(buf[at:at + (8 << 20)]):
            at = at + n if into is not None else 0
    return time.perf_counter() - t0


class Run:
    """A model, its optimizer and a training step on random tokens."""

    def __init__(self, model: str, *, batch: int, seq: int):
        from fm_pipeline.checkpoint import ModelState, OptimizerState
        from fm_pipeline.config import parse_job
        from fm_pipeline.model import Transformer

        self.job = parse_job({
            "name": "bench-ckpt", "model": WIDE if model == "wide" else {"size": model},
            "training": {"seq_len": seq, "global_batch_size": batch, "micro_batch_size": batch},
            "data": {"sources": [{"name": "a", "uri": "x", "weight": 1.0}]},
            "checkpoint": {"upload": False, "keep_last": 1000, "every_steps": 1}})
        self.model = Transformer(self.job.model_cfg)
        self.model.init_weights(seed=0)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.tokens = torch.randint(0, self.job.model_cfg.vocab_size, (batch, seq + 1))
        self.app_state = {"model": ModelState(self.model),
                          "optimizer": OptimizerState(self.model, self.opt)}

    def step(self) -> float:
        t0 = time.perf_counter()
        logits = self.model(self.tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), self.tokens[:, 1:].flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0


def measure(model: str, repeats: int, workdir: Path, *, write_threads: int = 1) -> dict:
    from fm_pipeline.catalog import CheckpointRef
    from fm_pipeline.checkpoint import CheckpointManager, restore

    run = Run(model, batch=2, seq=128)
    run.step()  # optimizer state exists from here on
    sync = CheckpointManager(run.job, run.app_state, root=workdir / "sync", async_save=False,
                             write_threads=write_threads, site=local_site.site())
    first = sync.save(1, tokens_seen=0).result()  # warm-up: allocations, imports
    nbytes = first.total_bytes
    payload = memoryview(os.urandom(1 << 20) * (nbytes >> 20) + os.urandom(nbytes % (1 << 20)))
    raw = workdir / "raw.bin"

    in_place = bytearray(nbytes)
    in_place[::4096] = b"\x01" * len(in_place[::4096])  # pre-fault, like live tensors
    write_s, save_s, read_s, load_s, verify_s, phases = [], [], [], [], [], []
    streamed_s, in_place_s, save_cpu = [], [], []
    for i in range(repeats):
        write_s.append(_raw_write(raw, payload))
        streamed_s.append(_raw_write_streamed(workdir / "streamed.bin", payload))
        t0, c0 = time.perf_counter(), _cpu_s()
        result = sync.save(10 + i, tokens_seen=0).result()
        save_s.append(time.perf_counter() - t0)
        save_cpu.append(_cpu_s() - c0)
        phases.append((result.write_s, result.checksum_s))
        read_s.append(_raw_read(raw))
        in_place_s.append(_raw_read(raw, into=in_place))
        ref = CheckpointRef.local(result.path)
        for f in ref.dir.iterdir():
            if f.is_file():
                _drop_cache(f)
        t0 = time.perf_counter()
        restored = restore(run.app_state, ref)
        load_s.append(time.perf_counter() - t0)
        verify_s.append(restored.verify_s)
    sync.close()
    del payload, in_place

    # Async: baseline steps, then a save, then the steps that overlap the background write.
    manager = CheckpointManager(run.job, run.app_state, root=workdir / "async", async_save=True,
                                write_threads=write_threads, site=local_site.site())
    blocks, calls, waits, extras, base_steps, overlapped = [], [], [], [], [], []
    step = 100
    for _ in range(repeats):
        base = statistics.median(run.step() for _ in range(3))
        base_steps.append(base)
        t0 = time.perf_counter()
        future = manager.save(step, tokens_seen=0)
        calls.append(time.perf_counter() - t0)
        during = []
        while not future.done() or not during:
            during.append(run.step())
        result = manager.wait()
        blocks.append(result.blocked_s)
        waits.append(result.staging_wait_s)
        extras.append(sum(s - base for s in during))
        overlapped.append(len(during))
        step += 1
    manager.close()

    med = statistics.median
    sync_save = med(save_s)

    def ratio(values: list[float]) -> tuple[float, float]:
        return med(values), max(values) - min(values)

    save_streamed = ratio([b / a for a, b in zip(save_s, streamed_s)])
    load = ratio([r / t for r, t in zip(read_s, load_s)])
    load_in_place = ratio([r / t for r, t in zip(in_place_s, load_s)])
    # Async repeats run after the sync ones: each against the median sync save.
    async_total = ratio([(b + e) / sync_save for b, e in zip(blocks, extras)])
    out = {
        "model": model, "bytes": nbytes, "repeats": repeats, "write_threads": write_threads,
        "tensors": sum(1 for v in run.model.state_dict().values()) * 3,
        "disk_write_bytes_per_s": nbytes / med(write_s),
        "save_bytes_per_s": nbytes / sync_save,
        "disk_read_bytes_per_s": nbytes / med(read_s),
        "load_bytes_per_s": nbytes / med(load_s),
        "disk_write_streamed_bytes_per_s": nbytes / med(streamed_s),
        "disk_read_into_place_bytes_per_s": nbytes / med(in_place_s),
        "verify_s": med(verify_s),
        "sync_save_s": sync_save,
        "sync_write_s": med(p[0] for p in phases),
        "sync_fsync_checksum_s": med(p[1] for p in phases),
        "async_block_s": med(blocks),
        "async_save_call_s": med(calls),
        "async_staging_wait_s": med(waits),
        "baseline_step_s": med(base_steps),
        "steps_overlapping_write": med(overlapped),
        "following_steps_extra_s": med(extras),
        "sync_save_cpu_s": med(save_cpu),
        "direct_io": _writes_direct(workdir),
    }
    out["save_ratio_streamed"], out["save_ratio_streamed_spread"] = save_streamed
    out["save_ratio"] = out["save_bytes_per_s"] / out["disk_write_bytes_per_s"]
    out["load_ratio"], out["load_ratio_spread"] = load
    out["load_ratio_in_place"], out["load_ratio_in_place_spread"] = load_in_place
    out["stall_ratio"] = out["async_block_s"] / sync_save
    out["async_total_s"] = out["async_block_s"] + out["following_steps_extra_s"]
    out["async_total_ratio"], out["async_total_ratio_spread"] = async_total
    out["targets_met"] = {"save_ratio_streamed": out["save_ratio_streamed"] >= SAVE_TARGET,
                          "load_ratio": out["load_ratio"] >= LOAD_TARGET,
                          "stall_ratio": out["stall_ratio"] <= STALL_TARGET,
                          "async_total_ratio": out["async_total_ratio"] < ASYNC_TOTAL_TARGET}
    return out


def _writes_direct(workdir: Path) -> bool:
    from fm_pipeline.checkpoint.writer import HashingFile

    stream = HashingFile(workdir / "probe.bin", algorithm=None)
    stream.close()
    return stream.direct


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wide", help="'wide' (default) or a registry size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write-threads", type=int, default=1,
                        help="DCP files per rank, written (and read) in parallel")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    torch.manual_seed(0)
    workdir = Path(tempfile.mkdtemp(prefix="fm-bench-ckpt-", dir=args.dir))
    try:
        out = measure(args.model, args.repeats, workdir, write_threads=args.write_threads)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    mb = 1e6
    print(f"state {out['bytes'] / mb:.0f} MB | save {out['save_bytes_per_s'] / mb:.0f} MB/s vs "
          f"the same streamed write {out['disk_write_streamed_bytes_per_s'] / mb:.0f} MB/s "
          f"(ratio {out['save_ratio_streamed']:.2f}; vs one write()+fsync "
          f"{out['save_ratio']:.2f}) | load {out['load_bytes_per_s'] / mb:.0f} MB/s vs "
          f"raw cold read {out['disk_read_bytes_per_s'] / mb:.0f} MB/s "
          f"(ratio {out['load_ratio']:.2f})")
    print(f"async save blocks {out['async_block_s'] * 1e3:.1f} ms (call "
          f"{out['async_save_call_s'] * 1e3:.1f} ms + staging wait "
          f"{out['async_staging_wait_s'] * 1e3:.1f} ms) vs sync save {out['sync_save_s']:.2f} s "
          f"(stall ratio {out['stall_ratio']:.3f}); the {out['steps_overlapping_write']:.0f} "
          f"step(s) overlapping the write took {out['following_steps_extra_s']:.2f} s longer "
          f"than steps without a save ({out['baseline_step_s']:.2f} s each): async costs "
          f"{out['async_total_s']:.2f} s, {out['async_total_ratio']:.2f} x a sync save "
          f"(whose CPU work is {out['sync_save_cpu_s']:.2f} s)")
    print(json.dumps({k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}))


if __name__ == "__main__":
    main()
