"""Stamp a benchmark's JSON line with the day it ran (the README table shows it).

    tail -n 1 out.txt | python -m benchmarks.stamp > data.json
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone


def main() -> None:
    result = json.loads(sys.stdin.read().strip().splitlines()[-1])
    result.setdefault("measured_on", datetime.now(timezone.utc).strftime("%Y-%m-%d"))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
