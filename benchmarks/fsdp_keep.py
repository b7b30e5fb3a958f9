"""ZeRO-1 as FSDP2 runs it (parallelism.fsdp_keep_gathered) against FSDP2's default, same run.

    python -m benchmarks.fsdp_keep                 # last stdout line: one JSON object
    python -m benchmarks.fsdp_keep --repeats 2     # quicker, noisier

The trainer (`torchrun --nproc_per_node 2 -m fm_pipeline.train`, gloo) trains the same
model from the same weights on the same batches twice per repeat: once with the weights
resharded after every micro-batch's forward and backward and the gradients reduce-scattered
every micro-batch (FSDP2's default, ZeRO-3), once with fsdp_keep_gathered (weights and
gradients whole through the step: one all-gather and one reduce-scatter per FSDP unit per
step). Each rank computes `--micro-batches` micro-batches a step, the case the flag is for.
Which side goes first alternates. Throughput over the timed window's wall time, as
benchmarks.trainer measures it (its run_trainer):

  keep_gathered_speedup   keep / default tokens per second, the median of the per-repeat
                          ratios, with its spread (max - min)

On this machine the collectives are gloo copies through shared memory and the ranks share
two cores, so the figure says what the saved collectives are worth here, not on NVLink or
InfiniBand, where the planner's cost model prices them (fm plan's zero1 layouts). The
memory the flag costs (whole weights and fp32 gradients on every rank) is not measured:
the trainer records accelerator memory only, and there is none here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks import trainer as bench_trainer

NPROC = 2


def write_job(home: Path, args) -> Path:
    from fm_pipeline.config import dump_job
    from fm_pipeline.data.testing import build_small_mix, small_job
    from fm_pipeline.storage import open_store

    steps = args.warmup + args.steps + 1  # the final checkpoint's step is not timed
    job = small_job(**{
        "name": "bench-fsdp-keep", "model.size": args.model, "model.vocab_size": 512,
        "training.seq_len": args.seq_len,
        "training.global_batch_size": NPROC * args.micro_batches,
        "training.micro_batch_size": 1, "training.steps": steps,
        "training.segment_steps": steps, "training.warmup_steps": 2,
        "training.rank_timings_every": 10, "checkpoint.every_steps": 10 * steps,
        "checkpoint.upload": False, "parallelism.nproc_per_node": NPROC})
    os.environ["FM_HOME"] = str(home)
    build_small_mix(job, store=open_store(str(home / "store")))
    path = home / "job.yaml"
    path.write_text(yaml.safe_dump(dump_job(job)))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batches", type=int, default=4, help="per rank per step")
    parser.add_argument("--steps", type=int, default=12, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    # benchmarks.trainer's window functions read its timed window from there.
    bench_trainer.ARGS = argparse.Namespace(warmup=args.warmup, steps=args.steps)
    from rich.progress import Progress

    home = Path(tempfile.mkdtemp(prefix="fm-bench-fsdp-keep-"))
    job = write_job(home, args)
    cores = os.cpu_count() or 1
    env = {**os.environ, "FM_HOME": str(home), "OMP_NUM_THREADS": str(max(1, cores // NPROC))}
    for key in ("FM_MLFLOW_URI", "MLFLOW_TRACKING_URI", "DAGSTER_PIPES_CONTEXT", "RANK",
                "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    pairs: list[tuple[dict, dict]] = []
    with Progress(transient=True) as progress:
        task = progress.add_task("keep_gathered vs FSDP2's default", total=2 * args.repeats)
        for i in range(args.repeats):
            order = (True, False) if i % 2 else (False, True)
            got = {}
            for keep in order:
                flag = f"parallelism.fsdp_keep_gathered={'true' if keep else 'false'}"
                got[keep] = bench_trainer.run_trainer(home, job, f"keep{int(keep)}-{i}", env,
                                                      NPROC, sets=(flag,))
                progress.advance(task)
            pairs.append((got[True], got[False]))
            print(f"repeat {i}: keep {got[True]['wall']:.0f} tok/s, default "
                  f"{got[False]['wall']:.0f} tok/s", file=sys.stderr, flush=True)
    ratios = [k["wall"] / d["wall"] for k, d in pairs]
    med = statistics.median
    keep_losses, default_losses = pairs[0][0]["losses"], pairs[0][1]["losses"]
    result = {
        "model": args.model, "seq_len": args.seq_len, "ranks": NPROC,
        "micro_batches_per_rank": args.micro_batches, "timed_steps": args.steps,
        "repeats": args.repeats, "cores": cores,
        "keep_gathered_speedup": round(med(ratios), 4),
        "keep_gathered_speedup_spread": round(max(ratios) - min(ratios), 4),
        "keep_wall_tokens_per_s": round(med(k["wall"] for k, _ in pairs), 1),
        "default_wall_tokens_per_s": round(med(d["wall"] for _, d in pairs), 1),
        "keep_runs_wall_tokens_per_s": [round(k["wall"], 1) for k, _ in pairs],
        "default_runs_wall_tokens_per_s": [round(d["wall"], 1) for _, d in pairs],
        # The same training: the losses agree to float rounding (summation order).
        "max_loss_diff": max(abs(a - b) for a, b in zip(keep_losses, default_losses)),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
