"""A stand-in torchrun worker: `torchrun ... -m tests.launch.tiny_worker --job J --end-step N`.

It takes the trainer's arguments and does what FM_TINY_WORKER says, so each launcher path
(crash with a traceback, deliberate exit with a code, death by a signal, preemption by
SIGTERM or by the flag file, a gloo all-reduce across nodes, Dagster Pipes from rank 0)
is exercised without training a model. Only torch-free behaviours stay torch-free, so
most tests start in a second.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from fm_pipeline.rundir.exit_record import exit_with

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--end-step", type=int, required=True)
    parser.add_argument("--set", action="append", default=[])
    return parser.parse_args()


def crash_with_traceback(args) -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        if RANK == 1:
            raise RuntimeError(f"boom at step 3 of {args.end_step}")
        time.sleep(30)  # torchrun stops the healthy rank once rank 1 has failed

    main()


def wait_for_preemption(args) -> None:
    flag = os.environ["FM_PREEMPT_FILE"]
    stop = {"signal": None}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(signal="SIGTERM"))
    print(f"rank {RANK} ready", flush=True)
    for step in range(1, 600):
        if stop["signal"] or os.path.exists(flag):
            why = stop["signal"] or "flag file"
            exit_with(75, f"preempted ({why}) at step {step}; checkpoint step-{step:08d} saved")
        time.sleep(0.05)
    exit_with(1, "never preempted")


def all_reduce(args) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(RANK + 1)])
    dist.all_reduce(value)
    out = os.environ["FM_TINY_OUT"]
    with open(os.path.join(out, f"rank{RANK}.json"), "w") as f:
        json.dump({"rank": RANK, "world": WORLD, "sum": value.item(),
                   "job": args.job, "end_step": args.end_step,
                   "store": os.environ.get("FM_STORE_URI")}, f)
    dist.destroy_process_group()


def pipes(args) -> None:
    if RANK == 0:
        from dagster_pipes import open_dagster_pipes

        with open_dagster_pipes() as context:
            context.log.info(f"tiny worker reached step {args.end_step}")
            context.report_asset_materialization(metadata={"end_step": args.end_step})


def start_helper() -> None:
    """A helper in a session of its own that ignores SIGTERM and outlives its worker (as a
    leaked data-loader or compile worker would); its pid in FM_TINY_OUT/helper<rank>."""
    import subprocess

    helper = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); time.sleep(600)"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(os.environ["FM_TINY_OUT"], f"helper{RANK}"), "w") as f:
        f.write(str(helper.pid))


def main() -> None:
    args = _args()
    behaviour = os.environ.get("FM_TINY_WORKER", "ok")
    print(f"tiny worker rank {RANK}/{WORLD}: {behaviour}", flush=True)
    if behaviour.startswith("helper+"):
        start_helper()
        behaviour = behaviour.removeprefix("helper+")
    if behaviour == "ok":
        return
    if behaviour == "crash":
        crash_with_traceback(args)
    elif behaviour == "bad_config":
        exit_with(2, "training.seq_len 4096 exceeds the data mix's seq_len 128")
    elif behaviour == "preempt":
        wait_for_preemption(args)
    elif behaviour == "sigkill":
        if RANK == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)
    elif behaviour == "ignore_sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(os.path.join(os.environ["FM_TINY_OUT"], f"pid{RANK}"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)
    elif behaviour == "plain_exit":
        sys.exit(3 if RANK == 0 else 0)  # no record at all: only torchrun's summary knows
    elif behaviour == "all_reduce":
        all_reduce(args)
    elif behaviour == "pipes":
        pipes(args)
    else:
        raise SystemExit(f"unknown FM_TINY_WORKER {behaviour!r}")


if __name__ == "__main__":
    main()
