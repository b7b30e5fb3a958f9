"""datatrove's MinHash pipeline (its four file-based stages, LocalPipelineExecutor) on a folder
of JSONL documents: the side-by-side of `benchmarks.data_stages`. Runs in its own process
with datatrove on PYTHONPATH (installed only for the benchmark, never a dependency).

    PYTHONPATH=<datatrove target> python benchmarks/datatrove_minhash.py IN WORK \
        --tasks 16 --workers 2 --bands 14 --rows 8 --ngram 5 --seed 1
    # last stdout line: {"wall_s": ..., "removed": [doc ids], ...}

Stages as in datatrove's examples/minhash_deduplication.py: signatures per task, buckets
per band, clusters (one task), filter (per task, writing kept and removed documents).

`--tokenizer regex` (the default) splits the simplified text into words with `\w+`, as our
near-dedup does (fm_pipeline/data/near_dedup.py), through datatrove's own hook for a custom
WordTokenizer; `spacy` keeps its English default (spaCy's tokenizer: the same words on a
letters-only corpus, at a fraction of the speed, which is not the dedup being compared).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path


_WORD = re.compile(r"\w+")


def regex_tokenizer():
    """datatrove's WordTokenizer interface over the `\w+` split ours uses."""
    from datatrove.utils.word_tokenizers import WordTokenizer

    class RegexWordTokenizer(WordTokenizer):
        def word_tokenize(self, text: str) -> list[str]:
            return _WORD.findall(text)

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [m.span() for m in _WORD.finditer(text)]

    return RegexWordTokenizer("en")


def main() -> None:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("work")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bands", type=int, default=14)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer", choices=("regex", "spacy"), default="regex")
    args = ap.parse_args()
    language = regex_tokenizer() if args.tokenizer == "regex" else "eng"

    work = Path(args.work)
    config = MinhashConfig(n_grams=args.ngram, num_buckets=args.bands,
                           hashes_per_bucket=args.rows, seed=args.seed,
                           hash_config=HashConfig(precision=64))

    def reader():
        return JsonlReader(args.input, text_key="text", id_key="id", glob_pattern="*.jsonl")

    stages = [
        LocalPipelineExecutor(
            pipeline=[reader(), MinhashDedupSignature(output_folder=str(work / "sigs"),
                                                      config=config, language=language)],
            tasks=args.tasks, workers=args.workers, logging_dir=str(work / "logs/sigs")),
        LocalPipelineExecutor(
            pipeline=[MinhashDedupBuckets(input_folder=str(work / "sigs"),
                                          output_folder=str(work / "buckets"), config=config)],
            tasks=args.bands, workers=args.workers, logging_dir=str(work / "logs/buckets")),
        LocalPipelineExecutor(
            pipeline=[MinhashDedupCluster(input_folder=str(work / "buckets"),
                                          output_folder=str(work / "remove"), config=config)],
            tasks=1, workers=1, logging_dir=str(work / "logs/clusters")),
        LocalPipelineExecutor(
            pipeline=[reader(), MinhashDedupFilter(
                input_folder=str(work / "remove"),
                exclusion_writer=JsonlWriter(str(work / "removed"), compression=None)),
                JsonlWriter(str(work / "kept"), compression=None)],
            tasks=args.tasks, workers=args.workers, logging_dir=str(work / "logs/filter")),
    ]
    t0 = time.perf_counter()
    for stage in stages:
        stage.run()
    wall = time.perf_counter() - t0
    removed = []
    for path in sorted((work / "removed").glob("*.jsonl")):
        removed += [json.loads(line)["id"] for line in path.read_text().splitlines() if line]
    kept = sum(1 for p in (work / "kept").glob("*.jsonl") for _ in p.open())
    print(json.dumps({"wall_s": wall, "removed": removed, "kept": kept,
                      "tokenizer": args.tokenizer}))


if __name__ == "__main__":
    main()
