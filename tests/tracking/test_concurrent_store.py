"""Several processes opening one new MLflow sqlite store at once (three segment runs that
start together on a fresh FM_HOME): every one gets the same experiment, none breaks the
schema (unserialised, MLflow's migrations race: "Online migration expected to match one
row ... 0 found")."""

from __future__ import annotations

import subprocess
import sys

OPEN = """
import sys
from fm_pipeline.tracking import JobTracker
print(JobTracker(sys.argv[1]).experiment_id)
"""


def test_processes_opening_a_new_sqlite_store_together_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    procs = [subprocess.Popen([sys.executable, "-c", OPEN, uri], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err[-2000:]
    assert len({out.strip().splitlines()[-1] for out, _ in results}) == 1
