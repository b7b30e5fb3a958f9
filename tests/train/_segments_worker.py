"""Runs several training segments in ONE torchrun launch (each a job spec path), sharing the
process group: checking many parallelism layouts costs one interpreter start-up, not many.

    torchrun --standalone --nproc-per-node 4 tests/train/_segments_worker.py A.yaml B.yaml
"""

import sys

from fm_pipeline.config import load_job
from fm_pipeline.parallel import init_distributed
from fm_pipeline.train.segment import run_segment

if __name__ == "__main__":
    init_distributed()
    for path in sys.argv[1:]:
        result = run_segment(load_job(path))
        assert result.exit_code == 0, (path, result.summary)
