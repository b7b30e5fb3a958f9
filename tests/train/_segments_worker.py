"""Runs several training segments in ONE torchrun launch (each a job spec path), sharing the
process group: checking many parallelism layouts costs one interpreter start-up, not many.

    torchrun --standalone --nproc-per-node 4 tests/train/_segments_worker.py A.yaml B.yaml@3

`PATH@N` stops that segment after step N (`--end-step N`); `PATH@N<CHECKPOINT` starts it
from that checkpoint (`--resume-from`), whatever layout wrote it.
"""

import sys

from fm_pipeline.config import load_job
from fm_pipeline.config.site import Site
from fm_pipeline.parallel import init_distributed
from fm_pipeline.train.segment import run_segment

if __name__ == "__main__":
    init_distributed()
    for arg in sys.argv[1:]:
        path, _, rest = arg.partition("@")
        end, _, resume_from = rest.partition("<")
        result = run_segment(load_job(path), site=Site.from_environ(),
                             end_step=int(end) if end else None, resume_from=resume_from or None)
        assert result.exit_code == 0, (path, result.summary)
