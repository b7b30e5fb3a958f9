"""Saves step 1, then starts saving step 2 and stops after the DCP files are written (before
the manifest), announcing it in a file so the test can SIGKILL it there.

    python -m tests.checkpoint.kill_worker <ready-file>     (FM_HOME set by the test)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from torch.distributed.checkpoint import FileSystemWriter

from fm_pipeline.checkpoint import CheckpointManager
from tests.checkpoint.tiny import TinyLM, Trainer, tiny_job
from tests import local_site


def main(ready: Path) -> None:
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(tiny_job(), trainer.app_state, async_save=True, site=local_site.site())
    trainer.step(1)
    manager.save(1, tokens_seen=32)
    manager.wait()
    original = FileSystemWriter.finish

    def finish_then_hang(self, metadata, results):
        original(self, metadata, results)  # every data file and .metadata are on disk
        ready.write_text("written")
        time.sleep(600)

    FileSystemWriter.finish = finish_then_hang
    trainer.step(2)
    manager.save(2, tokens_seen=64)
    time.sleep(600)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
