"""The loader's speculative shard prefetch on a slow remote store, against the same loader
without it, in the same run.

    python -m benchmarks.remote_data            # last stdout line: one JSON object

The remote store is a local directory behind a link model: every object read waits
`--latency-ms` for its first byte, then its bytes go through one link of `--mb-per-s`
shared by every read in flight (FIFO: 4 parallel fetches get the link's bandwidth between
them, not 4 times it; a sleep, so the wait is real I/O wait, as on a network; the shard
bytes are the mix's). Shards of `--shard-mib` MiB (1 by default: 512 Ki tokens of uint16,
the small end of what pretraining stores hold; MosaicML's streaming defaults to 64 MB,
which a 2-core benchmark cannot fill with enough shards) and steps of 32 sequences of
512 tokens, so a shard lasts 32 steps of one rank. Each step takes the next
batch from a MixLoader (one dp rank, fresh cache per run, so every shard is remote the
first time a step reads it) and then does `--compute-ms` of real work (matmuls, calibrated
once; the measured time per step is reported). Both sides read the same global samples; only `shard_lookahead` differs (0: each
shard is downloaded by the step that needs it, as before; 8: the shards of the next 8
steps are fetched in the background, 4 at a time).

stall_ratio                the headline: time the steps waited in next() with / without,
                           median of the rounds' ratios (sides alternate within a round);
                           target <= 0.5 (at least half the data stall gone)
remote_speedup             wall time without / with: how much of the run the stall was
                           (diluted once every shard is cached: in this small mix all of
                           them are read within the first steps of the run)
stall_s_per_step_*         time a step waited in next(), per step (median over rounds)
on_demand_*                shards a step had to download itself
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from benchmarks.data import corpus_dir
from fm_pipeline.data import MixLoader, mix_key, open_mix, prepare_mix
from fm_pipeline.data.testing import small_job
from fm_pipeline.storage import open_store
from fm_pipeline.storage.local import LocalStore

TARGET = 0.5  # stall_ratio


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class SlowLink(LocalStore):
    """A local directory read as if it were remote: no local path; each read waits its
    latency (in parallel with the others), then its bytes queue on the one shared link."""

    def __init__(self, root: Path, *, latency_s: float, bytes_per_s: float):
        super().__init__(root)
        self.latency_s, self.bytes_per_s = latency_s, bytes_per_s
        self._lock = threading.Lock()
        self._link_free_at = 0.0

    def local_path(self, key: str):
        return None

    def _wait(self, size: int) -> None:
        first_byte = time.monotonic() + self.latency_s
        with self._lock:
            begin = max(first_byte, self._link_free_at)
            self._link_free_at = done = begin + size / self.bytes_per_s
        time.sleep(max(0.0, done - time.monotonic()))

    def get_file(self, key: str, local):
        path = super().get_file(key, local)
        self._wait(Path(path).stat().st_size)
        return path

    def get_bytes(self, key: str) -> bytes:
        data = super().get_bytes(key)
        self._wait(len(data))
        return data


def calibrated_compute(ms: float):
    """A function doing about `ms` of matmuls on this machine."""
    a = torch.randn(256, 256)

    def work(n: int) -> None:
        for _ in range(n):
            a @ a

    work(50)  # warm up: the first matmuls are slower
    t0 = time.perf_counter()
    work(200)
    per = (time.perf_counter() - t0) / 200
    n = max(1, round(ms / 1e3 / per))
    return lambda: work(n)


def run(store, key: str, cache: Path, *, lookahead: int, steps: int, gbs: int, seq_len: int,
        compute) -> dict:
    shutil.rmtree(cache, ignore_errors=True)
    mix = open_mix(store, key, cache_dir=cache)
    loader = MixLoader(mix, dp_rank=0, dp_size=1, micro_batch_size=gbs, global_batch_size=gbs,
                       seq_len=seq_len, shard_lookahead=lookahead)
    waited = computed = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        w0 = time.perf_counter()
        next(loader)
        w1 = time.perf_counter()
        compute()
        waited += w1 - w0
        computed += time.perf_counter() - w1
    wall = time.perf_counter() - t0
    loader.close()
    mix.close()
    return {"wall_s": wall, "stall_s_per_step": waited / steps,
            "compute_s_per_step": computed / steps, **mix.prefetch_stats}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=24.0, help="megabytes of source text")
    ap.add_argument("--shard-mib", type=float, default=1.0, help="MiB per token shard")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--latency-ms", type=float, default=40.0)
    ap.add_argument("--mb-per-s", type=float, default=20.0)
    ap.add_argument("--compute-ms", type=float, default=50.0)
    args = ap.parse_args()
    gbs, seq_len = 32, 512
    shard_tokens = int(args.shard_mib * 2**20 / 2)  # uint16 tokens (vocab 2,048)

    with tempfile.TemporaryDirectory(prefix="fm-bench-remote-") as tmp:
        root = Path(tmp)
        job = small_job(**{
            "data.sources": [{"name": "code", "uri": str(corpus_dir(root, args.mb)),
                              "format": "python-code", "weight": 1.0}],
            "data.shard_tokens": shard_tokens, "data.heldout_fraction": 0.0,
            "model.vocab_size": 2048, "model.size": "tiny", "training.seq_len": seq_len,
        })
        log(f"preparing {args.mb} MB of stdlib code")
        manifest = prepare_mix(job, open_store(root / "store"))
        key = mix_key(job)
        shards = sum(len(s.shards) for s in manifest.sources)
        store = SlowLink(root / "store", latency_s=args.latency_ms / 1e3,
                         bytes_per_s=args.mb_per_s * 1e6)
        compute = calibrated_compute(args.compute_ms)
        sides = {"plain": 0, "ahead": 8}
        results: dict[str, list[dict]] = {name: [] for name in sides}
        for r in range(args.repeats):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                results[name].append(run(store, key, root / f"cache-{name}",
                                         lookahead=sides[name], steps=args.steps, gbs=gbs,
                                         seq_len=seq_len, compute=compute))
            log(f"round {r + 1}/{args.repeats}: " + ", ".join(
                f"{n} {results[n][-1]['wall_s']:.2f} s (stall "
                f"{results[n][-1]['stall_s_per_step'] * 1e3:.0f} ms/step)" for n in sides))

    ratios = [p["wall_s"] / a["wall_s"] for p, a in zip(results["plain"], results["ahead"])]
    stalls = [a["stall_s_per_step"] / p["stall_s_per_step"]
              for p, a in zip(results["plain"], results["ahead"])]

    def med(name: str, field: str) -> float:
        return statistics.median(x[field] for x in results[name])

    out = {
        "benchmark": "remote_data",
        "stall_ratio": round(statistics.median(stalls), 3),
        "stall_ratio_spread": round(max(stalls) - min(stalls), 3),
        "remote_speedup": round(statistics.median(ratios), 3),
        "remote_speedup_spread": round(max(ratios) - min(ratios), 3),
        "repeats": args.repeats,
        "wall_s_plain": round(med("plain", "wall_s"), 3),
        "wall_s_ahead": round(med("ahead", "wall_s"), 3),
        "stall_s_per_step_plain": round(med("plain", "stall_s_per_step"), 4),
        "stall_s_per_step_ahead": round(med("ahead", "stall_s_per_step"), 4),
        "on_demand_plain": med("plain", "on_demand"),
        "on_demand_ahead": med("ahead", "on_demand"),
        "prefetched_ahead": med("ahead", "started"),
        "shards": shards, "shard_mib": args.shard_mib, "steps": args.steps,
        "latency_ms": args.latency_ms, "mb_per_s": args.mb_per_s, "link": "shared",
        "compute_s_per_step": round(statistics.median(
            x["compute_s_per_step"] for side in results.values() for x in side), 4),
        "target_stall_ratio": TARGET,
    }
    out["targets_met"] = {"stall_ratio": out["stall_ratio"] <= TARGET}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
