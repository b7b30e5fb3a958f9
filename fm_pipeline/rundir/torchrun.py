"""torch's own torchrun (`torch.distributed.run`, the same arguments), ending without the
interpreter's last full collection: the agent imports torch to start its workers, and on 2
cores that collection cost ~0.6 s of every launch (see exit_record.exit_with). Every local
launch of the product goes through it; imports torch only when run.

    python -m fm_pipeline.rundir.torchrun --standalone --nproc-per-node 2 -m fm_pipeline.train ...
"""

from __future__ import annotations

import gc
import sys

MODULE = "fm_pipeline.rundir.torchrun"


def torchrun_executable() -> list[str]:
    """torchrun by this interpreter (a venv need not be on PATH)."""
    return [sys.executable, "-m", MODULE]


def main() -> None:
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
    finally:
        gc.freeze()  # torchrun's own exit code (SystemExit) passes through


if __name__ == "__main__":
    main()
