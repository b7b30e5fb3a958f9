"""Our near-dedup against datatrove's MinHash pipeline on the same corpus, in the same run,
with the words split the same way.

    python -m benchmarks.datatrove_dedup              # 256 MB, 5 rounds; last line: JSON
    python -m benchmarks.datatrove_dedup --mb 16 --repeats 2

The corpus is benchmarks.data_stages's (random letters-only pseudo-words, 5% planted
near-duplicates). Both sides at datatrove's default geometry (14 bands x 8 rows of 5-word
shingles), 2 processes each, no signature verification on ours (a bucket collision is a
duplicate, as in datatrove), datatrove's words split with `\\w+` as ours
(benchmarks/datatrove_minhash.py --tokenizer regex). Each round runs both, the order
alternating:

  ours_s        our `clean_documents` asset through Dagster, 2 worker processes: it does
                more than the MinHash (normalisation, quality filters, exact dedup, writing
                the cleaned parts) and its wall includes Dagster's start
  datatrove_s   datatrove 0.10.1's four MinHash stages (signatures, buckets, clusters,
                filter), LocalPipelineExecutor with 2 workers
  vs_datatrove_throughput  datatrove_s / ours_s: the median of the rounds' ratios, with
                its spread (max - min)
  datatrove_agreement      documents with the same keep/remove decision on both sides
                           (both are deterministic: the last round's)

datatrove is installed into <FM_HOME>/bench-deps/datatrove with pip for this benchmark only
(never a dependency of the project).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from benchmarks.data_stages import (
    FILES,
    all_ids,
    doc_ids_of,
    job_spec,
    kept_doc_ids,
    log,
    run_dagster,
    run_datatrove,
    write_corpus,
)

TARGET = 1.0  # vs_datatrove_throughput: at least as fast while doing more


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=256.0, help="megabytes of corpus")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fm-bench-datatrove-") as tmp:
        root = Path(tmp)
        log(f"writing a {args.mb:.0f} MB corpus")
        corpus = write_corpus(root / "corpus", args.mb)
        task_bytes = int(corpus["bytes"] / (FILES // 2) * 1.1)  # 16 tasks, as data_stages
        ids = all_ids(root / "corpus")
        rounds = []
        for r in range(args.repeats):
            walls = {}
            for side in ("ours", "datatrove") if r % 2 == 0 else ("datatrove", "ours"):
                work = root / f"{side}-{r}"
                work.mkdir()
                if side == "ours":
                    job = job_spec(root / "corpus", task_bytes, 2, bands=14, rows=8,
                                   threshold=0.01)
                    out = run_dagster(job, work, ["clean_documents"])
                    kept = doc_ids_of(kept_doc_ids(out["store"], job), root / "corpus")
                else:
                    out = run_datatrove(root / "corpus", work, tasks=16, workers=2, bands=14,
                                        rows=8, tokenizer="regex")
                    removed = set(out["removed"])
                walls[side] = out["wall_s"]
                shutil.rmtree(work)
            rounds.append(walls)
            log(f"round {r + 1}/{args.repeats}: ours {walls['ours']:.1f} s, datatrove "
                f"{walls['datatrove']:.1f} s")
    ratios = [w["datatrove"] / w["ours"] for w in rounds]
    same = sum((i in kept) == (i not in removed) for i in ids)
    result = {
        "benchmark": "datatrove_dedup", "corpus_mb": round(corpus["bytes"] / 1e6, 1),
        "documents": len(ids), "tokenizer": "regex \\w+ (both)", "datatrove": "0.10.1",
        "ours_s": round(statistics.median(w["ours"] for w in rounds), 2),
        "datatrove_s": round(statistics.median(w["datatrove"] for w in rounds), 2),
        "vs_datatrove_throughput": round(statistics.median(ratios), 3),
        "vs_datatrove_throughput_spread": round(max(ratios) - min(ratios), 3),
        "datatrove_agreement": round(same / len(ids), 5),
        "ours_removed": len(ids) - len(kept), "datatrove_removed": len(removed),
        "repeats": len(rounds), "target_vs_datatrove_throughput": TARGET,
        "targets_met": {"vs_datatrove_throughput": statistics.median(ratios) >= TARGET,
                        "datatrove_agreement": same / len(ids) >= 0.99},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
