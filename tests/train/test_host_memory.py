"""The trainer keeps the host memory a step frees: re-allocating it faults no pages back in."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fm_pipeline.train.host_memory import malloc_tuned_by_user

# A step's worth of allocations (8 x 6 MiB) made and freed six times; page faults of each round.
ROUNDS = """
import json, resource, sys
from fm_pipeline.train.host_memory import keep_freed_host_memory
kept = keep_freed_host_memory() if sys.argv[1] == "keep" else None
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [bytearray(6 << 20) for _ in range(8)]
    del blocks
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults}))
"""


def rounds(mode: str, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True,
                         check=True, env={**os.environ, **env})
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or malloc_tuned_by_user(),
                    reason="glibc malloc with its default thresholds")
def test_freed_step_memory_is_reused_without_page_faults():
    plain = rounds("plain")
    assert min(plain["faults"][1:]) > 10_000  # glibc trims and re-faults 48 MiB every round
    kept = rounds("keep")
    assert kept["kept"] is True
    assert max(kept["faults"][1:]) < 100


def test_user_malloc_tuning_is_left_alone():
    kept = rounds("keep", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1")
    assert kept["kept"] is False
