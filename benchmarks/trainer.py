"""Trainer overhead: our segment trainer against a plain torch loop of the same model, same run.

    python -m benchmarks.trainer                 # last stdout line: one JSON object
    python -m benchmarks.trainer --steps 12 --repeats 2   # quicker, noisier

Both sides train the same model from the same initial weights on the same batches of the
same data mix (MixLoader), with AdamW, the warmup+cosine LR schedule and gradient clipping,
in fresh processes each, with the same thread count and malloc thresholds
(fm_pipeline.train.host_memory: without them either side may lose ~2% to page faults,
depending on where glibc happens to trim its heap). Two worlds:
  1 rank   trainer `python -m fm_pipeline.train` (process group, checkpoint manager,
           metrics files, preemption watch, per-rank timing gather, float64 grad norm)
           against a bare loop: forward, cross-entropy, backward, clip_grad_norm_,
           optimizer and scheduler step
  2 ranks  the trainer under `torchrun --nproc_per_node 2` (FSDP2 over both ranks, gloo)
           against a bare 2-rank FSDP2 loop: the same fully_shard units (each block, then
           the root) with the same resharding (every block but the last resharded after
           forward), the same steps, nothing else; one intra-op thread per rank
Checkpointing only after the timed steps (one extra step follows them, untimed).

Throughput over the timed window's wall time (from the end of the last warmup step to the
end of the last timed step; rank 0's metrics records for the trainer), so every periodic
cost (the rank-timing gather every 10 steps, flushes, anything between steps) counts:
  overhead_ratio_wall    trainer / bare loop, 1 rank (target >= 0.98): the headline
  fsdp2_overhead_ratio   trainer / bare FSDP2 loop, 2 ranks, the same way (target >= 0.98)
  overhead_ratio         1 rank, from the median step interval instead (resists bursts of
                         other load; hides periodic costs)
Each side runs `--repeats` times (default 5), alternating with the other; each ratio is
the median of the per-repeat ratios (trainer run / the bare run beside it; which goes
first alternates), with its spread (max - min). cpu_overhead_ratio: the same from each
process's CPU seconds per step (all threads; OpenMP threads spin while descheduled, so it
is noisy under load too). Plus the trainer's MFU against the measured CPU peak.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


TARGET = 0.98


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_job(home: Path, args, *, nproc: int) -> Path:
    from fm_pipeline.config import dump_job
    from fm_pipeline.data.testing import build_small_mix, small_job
    from fm_pipeline.storage import open_store

    # One step past the timed window: the trainer's final checkpoint must not be timed.
    steps = args.warmup + args.steps + 1
    job = small_job(**{
        "name": "bench-trainer", "model.size": args.model, "model.vocab_size": 512,
        "training.seq_len": args.seq_len, "training.global_batch_size": args.batch,
        "training.micro_batch_size": args.batch // nproc, "training.steps": steps,
        "training.segment_steps": steps, "training.warmup_steps": 2,
        "training.rank_timings_every": 10, "checkpoint.every_steps": 10 * steps,
        "checkpoint.upload": False, "parallelism.nproc_per_node": nproc})
    os.environ["FM_HOME"] = str(home)
    if not (home / "store").exists():
        build_small_mix(job, store=open_store(str(home / "store")))
    path = home / f"job-{nproc}.yaml"
    path.write_text(yaml.safe_dump(dump_job(job)))
    return path


def _command(nproc: int, module_args: list[str]) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", *module_args]
    from fm_pipeline.launch.local import torchrun_executable

    return torchrun_executable() + ["--standalone", f"--nproc_per_node={nproc}", "-m",
                                    *module_args]


def run_trainer(home: Path, job_path: Path, run: str, env: dict, nproc: int,
                sets: tuple[str, ...] = ()) -> dict:
    """One trainer run (`sets`: more --set dotted.key=value); its throughputs, losses and
    segment record."""
    from fm_pipeline.rundir.records import read_records

    name = f"bench-trainer-{run}"
    cmd = _command(nproc, ["fm_pipeline.train", "--job", str(job_path), "--set",
                           f"name={name}", *(a for kv in sets for a in ("--set", kv))])
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"trainer failed:\n{out.stderr[-3000:]}")
    steps = read_records(home / "runs" / name / "metrics.jsonl", "step")
    (segment,) = read_records(home / "runs" / name / "segments.jsonl", "segment")
    tokens = steps[0]["tokens"]
    stamps = [(r["step"], r["time"]) for r in steps]
    return {"median": _throughput(stamps, tokens), "wall": _wall_throughput(stamps, tokens),
            "cpu": _cpu_throughput([(r["step"], r["process_cpu_s"]) for r in steps], tokens),
            "losses": [r["loss"] for r in steps], "segment": segment}


def run_bare(job_path: Path, env: dict, nproc: int) -> dict:
    cmd = _command(nproc, ["benchmarks.trainer", "--bare", str(job_path),
                           "--warmup", str(ARGS.warmup)])
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"bare loop failed:\n{out.stderr[-3000:]}")
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def _timed() -> range:
    return range(ARGS.warmup + 1, ARGS.warmup + ARGS.steps + 1)


def _throughput(stamps: list[tuple[int, float]], tokens_per_step: int) -> float:
    """Tokens per second from the median step interval (end of step k-1 to end of step k)
    over the timed steps: bursts of other load on a shared machine hit a few steps, not
    the median."""
    at = dict(stamps)
    return tokens_per_step / statistics.median(at[s] - at[s - 1] for s in _timed())


def _wall_throughput(stamps: list[tuple[int, float]], tokens_per_step: int) -> float:
    """Tokens per second over the whole timed window: every second between the end of the
    last warmup step and the end of the last timed step counts."""
    at = dict(stamps)
    timed = _timed()
    return tokens_per_step * len(timed) / (at[timed[-1]] - at[timed[0] - 1])


def _cpu_throughput(cpu: list[tuple[int, float]], tokens_per_step: int) -> float:
    """Tokens per CPU second of the process: the median step's own CPU time (all threads)."""
    timed = [c for s, c in cpu if ARGS.warmup < s <= ARGS.warmup + ARGS.steps]
    return tokens_per_step / statistics.median(timed)


def bare_loop(job_path: Path) -> None:
    """The baseline, run in its own process(es): what anyone would write by hand. Under
    torchrun (WORLD_SIZE > 1): FSDP2 over all ranks, fully_shard per block and the root."""
    import torch
    import torch.distributed as dist

    from fm_pipeline.config import load_job
    from fm_pipeline.data import MixLoader, open_job_mix
    from fm_pipeline.model import Transformer
    from fm_pipeline.storage import open_store
    from fm_pipeline.train.host_memory import keep_freed_host_memory
    from fm_pipeline.train.optimizer import build_lr_scheduler, build_optimizer

    keep_freed_host_memory()  # as the trainer: without it, glibc may re-fault the heap each step
    job = load_job(job_path)
    t = job.training
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    model = Transformer(job.model_cfg)
    model.init_weights(seed=t.seed)
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (world,))
        blocks = list(model.layers.values())
        for i, block in enumerate(blocks):
            # As the trainer (parallel/fsdp.py): the last block stays gathered after forward,
            # backward needs it at once; otherwise the baseline does one all-gather more.
            fully_shard(block, mesh=mesh, reshard_after_forward=i < len(blocks) - 1)
        fully_shard(model, mesh=mesh)
    opt = build_optimizer(model, t)
    sched = build_lr_scheduler(opt, t)
    store = open_store(str(Path(os.environ["FM_HOME"]) / "store"))  # where write_job built it
    loader = MixLoader(open_job_mix(job, store), dp_rank=rank, dp_size=world,
                       micro_batch_size=t.micro_batch_size,
                       global_batch_size=t.global_batch_size, seq_len=t.seq_len)
    stamps, cpu = [], []
    for step in range(1, t.steps + 1):
        cpu0 = time.process_time()
        batch = next(loader)
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                 batch[:, 1:].flatten())
        aux = model.moe_aux_loss()  # an MoE model trains its balancing loss, as the trainer
        (loss if aux is None else loss + aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        stamps.append((step, time.time()))
        cpu.append((step, time.process_time() - cpu0))
    loader.close()
    if world > 1:
        dist.destroy_process_group()
    tokens = t.global_batch_size * t.seq_len
    if rank == 0:
        print(json.dumps({"tokens_per_s": _throughput(stamps, tokens),
                          "wall_tokens_per_s": _wall_throughput(stamps, tokens),
                          "cpu_tokens_per_s": _cpu_throughput(cpu, tokens)}))


ARGS = argparse.Namespace(warmup=3, steps=20)


def _timed_steps(job_path: Path) -> int:
    """The bare process learns the timed window from the job: steps = warmup + timed + 1."""
    from fm_pipeline.config import load_job

    return load_job(job_path).training.steps - ARGS.warmup - 1


def _ratio(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """Median and spread (max - min) of trainer / bare over paired runs."""
    values = [a / b for a, b in pairs]
    return round(statistics.median(values), 4), round(max(values) - min(values), 4)


def main() -> None:
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worlds", default="1,2", help="world sizes to measure")
    parser.add_argument("--bare", type=Path, help=argparse.SUPPRESS)
    ARGS = parser.parse_args()
    if ARGS.bare:
        ARGS.steps = _timed_steps(ARGS.bare)
        bare_loop(ARGS.bare)
        return
    from rich.progress import Progress

    home = Path(tempfile.mkdtemp(prefix="fm-bench-trainer-"))
    worlds = [int(w) for w in ARGS.worlds.split(",")]
    jobs = {n: write_job(home, ARGS, nproc=n) for n in worlds}
    cores = os.cpu_count() or 1
    runs: dict[int, list[tuple[dict, dict]]] = {n: [] for n in worlds}
    with Progress(transient=True) as progress:
        task = progress.add_task("trainer vs bare loop", total=2 * ARGS.repeats * len(worlds))
        for run in range(ARGS.repeats):
            for n in worlds:
                threads = os.environ.get("OMP_NUM_THREADS") if n == 1 else None
                threads = threads or str(max(1, cores // n))
                env = {**os.environ, "FM_HOME": str(home), "OMP_NUM_THREADS": threads}
                for key in ("FM_MLFLOW_URI", "MLFLOW_TRACKING_URI", "DAGSTER_PIPES_CONTEXT",
                            "RANK", "WORLD_SIZE", "LOCAL_RANK"):
                    env.pop(key, None)
                # Alternate which side goes first, so that neither always inherits the
                # other's after-effects (page cache, a neighbour's burst).
                if run % 2 == 0:
                    bare = run_bare(jobs[n], env, n)
                    progress.advance(task)
                trainer = run_trainer(home, jobs[n], f"{n}-{run}", env, n)
                progress.advance(task)
                if run % 2 == 1:
                    bare = run_bare(jobs[n], env, n)
                    progress.advance(task)
                runs[n].append((trainer, bare))
                log(f"run {run}, {n} rank(s): trainer {trainer['wall']:.0f} tok/s, bare "
                    f"{bare['wall_tokens_per_s']:.0f} tok/s over the timed window")
    from fm_pipeline.config import load_job
    from fm_pipeline.model import count_params

    job = load_job(jobs[worlds[0]])
    med = statistics.median
    result: dict = {"model": ARGS.model, "params": count_params(job.model_cfg).total,
                    "seq_len": ARGS.seq_len, "global_batch_size": ARGS.batch,
                    "timed_steps": ARGS.steps, "repeats": ARGS.repeats, "cores": cores}
    if 1 in runs:
        one = runs[1]
        wall = _ratio([(t["wall"], b["wall_tokens_per_s"]) for t, b in one])
        interval = _ratio([(t["median"], b["tokens_per_s"]) for t, b in one])
        result.update({
            "overhead_ratio_wall": wall[0], "overhead_ratio_wall_spread": wall[1],
            "trainer_wall_tokens_per_s": round(med(t["wall"] for t, _ in one), 1),
            "bare_loop_wall_tokens_per_s": round(med(b["wall_tokens_per_s"] for _, b in one), 1),
            "overhead_ratio": interval[0], "overhead_ratio_spread": interval[1],
            "trainer_tokens_per_s": round(med(t["median"] for t, _ in one), 1),
            "bare_loop_tokens_per_s": round(med(b["tokens_per_s"] for _, b in one), 1),
            "cpu_overhead_ratio": _ratio([(t["cpu"], b["cpu_tokens_per_s"]) for t, b in one])[0],
            "trainer_runs_wall_tokens_per_s": [round(t["wall"], 1) for t, _ in one],
            "bare_runs_wall_tokens_per_s": [round(b["wall_tokens_per_s"], 1) for _, b in one],
            "trainer_mean_mfu": one[-1][0]["segment"]["mean_mfu"],
            "peak_flops_per_device": one[-1][0]["segment"]["peak_flops_per_device"],
        })
    if 2 in runs:
        two = runs[2]
        fsdp = _ratio([(t["wall"], b["wall_tokens_per_s"]) for t, b in two])
        result.update({
            "fsdp2_overhead_ratio": fsdp[0], "fsdp2_overhead_ratio_spread": fsdp[1],
            "fsdp2_trainer_wall_tokens_per_s": round(med(t["wall"] for t, _ in two), 1),
            "fsdp2_bare_wall_tokens_per_s": round(med(b["wall_tokens_per_s"] for _, b in two), 1),
            "fsdp2_trainer_runs_wall_tokens_per_s": [round(t["wall"], 1) for t, _ in two],
            "fsdp2_bare_runs_wall_tokens_per_s": [round(b["wall_tokens_per_s"], 1) for _, b in two],
            "fsdp2_threads_per_rank": max(1, cores // 2),
        })
    result["targets_met"] = {k: result[k] >= TARGET for k in
                             ("overhead_ratio_wall", "fsdp2_overhead_ratio") if k in result}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
