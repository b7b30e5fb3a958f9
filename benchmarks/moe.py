"""Mixture-of-Experts trainer overhead: benchmarks.trainer on an MoE size, 1 rank.

    python -m benchmarks.moe                      # last stdout line: one JSON object
    python -m benchmarks.moe --repeats 3 --steps 12

`moe_overhead_ratio`: the segment trainer's throughput over a bare single-process loop of
the same MoE model (same weights, batches, AdamW schedule, clipping, and the balancing
loss on both sides), over the timed window's wall time, the median of the per-repeat
ratios with their spread (benchmarks/trainer.py measures it; target >= 0.95).
`alltoall_share`: the all-to-all's share of a 2-rank expert-parallel step (ep 2, FSDP over
the rest; benchmarks/moe_alltoall.py profiles it), the median over repeats with its spread.
On CPU the gloo all-to-all is a memory copy between two processes: the share says how much
of the step the dispatch and combine cost here, not what NVLink or InfiniBand would give.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="moe-tiny")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.trainer", "--model", args.model, "--worlds", "1",
         "--steps", str(args.steps), "--repeats", str(args.repeats)],
        check=True, capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    inner = json.loads(out.stdout.strip().splitlines()[-1])
    shares = [alltoall_run(args.model)["alltoall_share"] for _ in range(args.repeats)]
    print(json.dumps({
        "benchmark": "moe", "model": args.model, "params": inner["params"],
        "moe_overhead_ratio": inner.get("overhead_ratio_wall"),
        "moe_overhead_spread": inner.get("overhead_ratio_wall_spread"),
        "target": 0.95, "repeats": args.repeats, "timed_steps": args.steps,
        "alltoall_share": round(statistics.median(shares), 4),
        "alltoall_share_spread": round(max(shares) - min(shares), 4), "alltoall_shares": shares,
        "alltoall_layout": "2 ranks, ep 2 (gloo)",
        "trainer": inner,
    }))


def alltoall_run(model: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "benchmarks.moe_alltoall", "--model", model],
        check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
