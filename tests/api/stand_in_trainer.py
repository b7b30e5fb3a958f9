"""A stand-in for `fm_pipeline.train` under torchrun, for the local orchestrator's test:
it keeps the trainer's process contract (--job, --end-step; exit 0 at the end step; on a
preemption flag, exit 75 through the error record) without training anything.

    STAND_IN_HOLD_AT=N     at end step N: wait for a preemption flag, then exit 75;
                           any other end step: log it and exit 0
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from fm_pipeline.rundir.exit_record import exit_with


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--end-step", type=int, required=True)
    args = parser.parse_args()
    runs = Path(os.environ["FM_HOME"]) / "runs" / args.job.parent.parent.parent.name
    with open(runs / "stand_in.log", "a", encoding="utf-8") as log:
        log.write(f"end_step={args.end_step}\n")
    if os.environ.get("STAND_IN_HOLD_AT") == str(args.end_step):
        flag = Path(os.environ["FM_PREEMPT_FILE"])  # set by the launcher, as for the trainer
        deadline = time.monotonic() + 60
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        exit_with(75, f"preempted before step {args.end_step}")
    exit_with(0, "done")


if __name__ == "__main__":
    main()
