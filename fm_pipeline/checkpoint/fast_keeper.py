"""The node keeper of the fast tier: bounds what stays in a node's memory once its jobs are
gone. Torch-free; runs as the DaemonSet `fm k8s render` writes beside a job that uses the
fast tier (launch/keeper.py), one per node, on the same hostPath as the trainers' pods.

    python -m fm_pipeline.checkpoint.fast_keeper --root /var/lib/fm-fast [--idle-s 3600]
    python -m fm_pipeline.checkpoint.fast_keeper --root DIR --once     # one sweep, then exit

The trainers bound a live run themselves (two snapshots per rank, two replicas per peer,
docs/checkpoints.md) and free it at a clean end. What they cannot free is a run whose pods
are gone for good: a job that failed past its restarts, was deleted, or resumed on other
nodes. Its progress files stop changing (every rank writes one each step), so a run whose
newest file is older than `idle_s` is deleted, whole. `idle_s` must exceed the longest
pause of a live run (a JobSet restart, a slow step); the default is an hour.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("fm_pipeline.fast_keeper")

DEFAULT_IDLE_S = 3600.0


@dataclass
class Sweep:
    removed: list[tuple[str, int, float]] = field(default_factory=list)  # (run, bytes, idle)
    kept: list[tuple[str, int, float]] = field(default_factory=list)

    @property
    def held_bytes(self) -> int:
        return sum(b for _, b, _ in self.kept)

    def line(self) -> str:
        freed = sum(b for _, b, _ in self.removed)
        return (f"fast tier: {len(self.kept)} run(s) kept ({self.held_bytes / 2**20:.1f} MiB), "
                f"{len(self.removed)} idle run(s) removed ({freed / 2**20:.1f} MiB freed)")


def _usage(run: Path) -> tuple[int, float]:
    """(bytes, newest modification time) of every file under a run directory."""
    size, newest = 0, run.stat().st_mtime
    for path in run.rglob("*"):
        try:
            st = path.stat()
        except OSError:  # deleted meanwhile by its trainer
            continue
        newest = max(newest, st.st_mtime)
        if path.is_file():
            size += st.st_size
    return size, newest


def sweep(root: Path, *, idle_s: float = DEFAULT_IDLE_S, now: float | None = None) -> Sweep:
    """Delete every run directory (<root>/<job>/<run>) idle for longer than `idle_s`, and
    job directories left empty; report what is kept."""
    now = time.time() if now is None else now
    out = Sweep()
    if not root.is_dir():
        return out
    for job in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for run in sorted(p for p in job.iterdir() if p.is_dir()):
            try:
                size, newest = _usage(run)
            except OSError:
                continue
            idle = now - newest
            name = f"{job.name}/{run.name}"
            if idle > idle_s:
                shutil.rmtree(run, ignore_errors=True)
                out.removed.append((name, size, idle))
                log.info("removed %s: idle %.0f s, %.1f MiB", name, idle, size / 2**20)
            else:
                out.kept.append((name, size, idle))
        try:
            job.rmdir()  # only when empty
        except OSError:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fm_pipeline.checkpoint.fast_keeper",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, required=True,
                        help="the fast tier's directory on this node (the pods' hostPath)")
    parser.add_argument("--idle-s", type=float, default=DEFAULT_IDLE_S,
                        help="remove a run whose files are all older than this")
    parser.add_argument("--every-s", type=float, default=60.0, help="seconds between sweeps")
    parser.add_argument("--once", action="store_true", help="one sweep, then exit")
    args = parser.parse_args(argv)
    if args.idle_s <= 0 or args.every_s <= 0:
        parser.error("--idle-s and --every-s must be > 0")
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(message)s")
    while True:
        log.info(sweep(args.root, idle_s=args.idle_s).line())
        if args.once:
            return 0
        time.sleep(args.every_s)


if __name__ == "__main__":
    sys.exit(main())
