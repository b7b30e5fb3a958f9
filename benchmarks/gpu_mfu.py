"""MFU of the real trainer on one GPU: a llama3-1b-shaped model in BF16, compiled per block.

    python -m benchmarks.gpu_mfu                      # one CUDA device; last stdout line: JSON
    python -m benchmarks.gpu_mfu --compare-eager      # also the same run without compile
    python -m benchmarks.gpu_mfu --device cpu --tiny  # the same code path on CPU (a minute)

It runs what a user runs: `torchrun --nproc-per-node 1 -m fm_pipeline.train` on a job spec
written here, over a real data mix prepared here (the `email` package of the interpreter's
standard library, `fm_pipeline.data.testing`), and reads the trainer's own metrics.jsonl.
MFU is the trainer's: `fm_pipeline.model.flops` (6N + attention, PaLM convention; the tied
embedding counted once, as the output matmul) over the datasheet peak of
`fm_pipeline.accelerators` (dense BF16: H100/H200 989 TFLOP/s).

The model is llama3-1b exactly, Llama 3's 128,256-row embedding included; the tokenizer,
trained on the small corpus, uses only its first few thousand ids (the others are never
seen), which changes nothing in the FLOPs or the kernels. Steps before `--warmup` (compile,
allocator warm-up) are left out; step time is the median of the rest.

JSON fields: mfu, tokens_per_s, step_time_s, peak_memory_gib, first_step_s (compile
included), and with --compare-eager an `eager` object with the same fields (eager runs
first; a failed run leaves `error` instead of figures, the other still reports, exit 1). A
machine without CUDA fails at once with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
NO_DEVICE = 2


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true",
                   help="a 2-layer debug model and a few steps: checks the path, measures nothing")
    p.add_argument("--model", default="llama3-1b")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per forward pass")
    p.add_argument("--batch", type=int, default=8, help="sequences per optimizer step")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5, help="first steps left out of the figures")
    p.add_argument("--no-compile", action="store_true", help="measure eager only")
    p.add_argument("--compare-eager", action="store_true", help="also an eager run")
    p.add_argument("--home", type=Path, default=None, help="FM_HOME (default: a temp dir)")
    args = p.parse_args(argv)
    if args.tiny:
        args.model, args.seq_len, args.micro_batch, args.batch = "debug", 64, 2, 4
        args.steps, args.warmup = min(args.steps, 4), min(args.warmup, 1)
    if args.warmup >= args.steps:
        p.error(f"--warmup ({args.warmup}) must be below --steps ({args.steps})")
    return args


def require_device(args) -> str:
    """The device's name, or exit 2 at once: without CUDA there is nothing to measure."""
    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            msg = (f"no CUDA device: torch {torch.__version__} sees none (CUDA build: "
                   f"{torch.version.cuda or 'no, a CPU-only torch'}). Run this on a GPU "
                   "machine, or `--device cpu --tiny` to check the code path")
            log(f"error: {msg}")
            print(json.dumps({"error": msg}))
            sys.exit(NO_DEVICE)
        return torch.cuda.get_device_name(0)
    if not args.tiny:
        log(f"error: --device cpu trains {args.model} for hours; add --tiny to check the path")
        sys.exit(NO_DEVICE)
    return "cpu"


def job_overrides(args, *, compile: bool) -> dict:
    size = {"model.size": args.model, "model.vocab_size": None}  # the size's own vocabulary
    if args.tiny:
        size.update({"model.n_layers": 2, "model.vocab_size": 512})
    steps = args.steps
    return {
        **size, "name": "gpu-mfu" + ("-compiled" if compile else "-eager"),
        "parallelism.nproc_per_node": 1, "parallelism.mixed_precision": "bf16",
        "training.compile": compile, "training.seq_len": args.seq_len,
        "training.global_batch_size": args.batch, "training.micro_batch_size": args.micro_batch,
        "training.steps": steps, "training.segment_steps": steps, "training.warmup_steps": 2,
        "training.lr": 3e-4, "training.min_lr": 3e-5, "training.rank_timings_every": steps,
        # One checkpoint, after the last (timed) step: the segment always ends with one.
        "checkpoint.every_steps": 10 * steps, "checkpoint.keep_last": 1,
        "checkpoint.upload": False,
    }


def write_job(home: Path, args, *, compile: bool) -> Path:
    from fm_pipeline.config import dump_job
    from fm_pipeline.data.testing import build_small_mix, small_job
    from fm_pipeline.storage import open_store

    job = small_job(**job_overrides(args, compile=compile))
    t0 = time.perf_counter()
    build_small_mix(job, store=open_store(str(home / "store")))  # reused if already there
    log(f"data mix for {job.name}: {time.perf_counter() - t0:.1f}s")
    path = home / f"{job.name}.yaml"
    path.write_text(yaml.safe_dump(dump_job(job)))
    return path


def train(home: Path, job_path: Path, name: str, args) -> dict:
    """One segment under torchrun (one process), figures from its metrics records."""
    from fm_pipeline.rundir.records import read_records

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FM_", "MLFLOW_", "DAGSTER_PIPES_", "TORCHELASTIC_"))}
    env.update(FM_HOME=str(home), PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # --device cpu means the CPU even on a GPU machine
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
           "-m", "fm_pipeline.train", "--job", str(job_path)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        log(out.stdout[-3000:])
        reason = next((ln for ln in out.stderr.splitlines() if ln.startswith("error:")),
                      "see the traceback below")
        raise RuntimeError(f"trainer ({name}) exited {out.returncode}: {reason}\n"
                           f"{out.stderr[-5000:]}")
    steps = read_records(home / "runs" / name / "metrics.jsonl", "step")
    (segment,) = read_records(home / "runs" / name / "segments.jsonl", "segment")
    # Its final checkpoint (15 GB for llama3-1b) is not needed: leave the disk to the next run.
    shutil.rmtree(home / "runs" / name / "checkpoints", ignore_errors=True)
    return summarise(steps, segment, warmup=args.warmup, wall_s=wall)


def summarise(steps: list[dict], segment: dict, *, warmup: int, wall_s: float) -> dict:
    timed = [r for r in steps if r["step"] > warmup]
    step_time = statistics.median(r["step_time_s"] for r in timed)
    mfus = [r["mfu"] for r in timed if r.get("mfu") is not None]
    memory = [r["peak_memory_gib"] for r in steps if r.get("peak_memory_gib") is not None]
    return {
        "mfu": round(statistics.median(mfus), 4) if mfus else None,
        "tokens_per_s": round(steps[0]["tokens"] / step_time, 1),
        "step_time_s": round(step_time, 4),
        "peak_memory_gib": round(max(memory), 2) if memory else None,
        "first_step_s": round(steps[0]["step_time_s"], 2),
        "final_loss": round(steps[-1]["loss"], 4),
        "timed_steps": len(timed), "segment_wall_s": round(wall_s, 1),
        "peak_flops_per_device": segment.get("peak_flops_per_device"),
        "accelerator": segment.get("accelerator"),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device_name = require_device(args)  # before any work: no CUDA, no minutes spent
    from fm_pipeline.config import load_job
    from fm_pipeline.model import count_params, flops_per_token

    home = args.home or Path(tempfile.mkdtemp(prefix="fm-gpu-mfu-"))
    home.mkdir(parents=True, exist_ok=True)
    compile = not args.no_compile
    # Eager first: quick and certain, so a compile problem still leaves a baseline.
    runs = ([False] if args.compare_eager and compile else []) + [compile]
    results = {}
    for compiled in runs:
        job_path = write_job(home, args, compile=compiled)
        job = load_job(job_path)
        log(f"training {job.name}: {args.steps} steps ...")
        try:
            results[compiled] = train(home, job_path, job.name, args)
        except RuntimeError as e:  # the other run's figures are still worth printing
            log(str(e))
            results[compiled] = {"error": str(e).splitlines()[0], "step_time_s": None}
        log(f"{job.name}: {json.dumps(results[compiled])}")
    cfg = job.model_cfg
    main_run = results[compile]
    report = {
        **main_run, "compile": compile, "device": device_name, "model": args.model,
        "params": count_params(cfg).total, "vocab_size": cfg.vocab_size,
        "flops_per_token": flops_per_token(cfg, args.seq_len), "seq_len": args.seq_len,
        "global_batch_size": args.batch, "micro_batch_size": args.micro_batch,
        "tokens_per_step": args.batch * args.seq_len, "steps": args.steps,
        "warmup_steps": args.warmup, "mixed_precision": "bf16", "tiny": args.tiny,
    }
    if compile and False in results:
        report["eager"] = results[False]
        if results[False]["step_time_s"] and main_run["step_time_s"]:
            report["compile_speedup"] = round(
                results[False]["step_time_s"] / main_run["step_time_s"], 3)
    print(json.dumps(report))
    if any("error" in r for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
