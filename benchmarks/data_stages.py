"""The data mix prepared as tasks: the whole `data_mix_job` with 1 and 2 worker processes,
peak memory per worker as the corpus grows 4x, near-dedup recall on planted pairs, and
datatrove's MinHash pipeline on the same corpus, all in one run.

    python -m benchmarks.data_stages                       # 256 MB corpus, 3 rounds
    python -m benchmarks.data_stages --mb 1000 --repeats 1 # the issue's ~1 GB corpus

The corpus: JSONL files of random pseudo-words (letters only, so that datatrove's digit
normalisation leaves them alone), where 5% of the documents are planted near-duplicates
of an earlier one at known Jaccard similarities (fm_pipeline/data/planted.py), placed
anywhere later in the corpus, in any file.

workers_speedup      wall of the whole prepare (clean, tokenizer, shards, publish and the
                     Great Expectations checks, through Dagster) with 1 worker (in-process
                     executor) / with 2 (multiprocess executor); median of per-round ratios.
                     Both have every core: the 1-worker run's tokenizer already encodes on
                     all of them (tokenizers' thread pool), so on 2 cores this is capped
                     well below 2 by the tokenizing share (docs/data.md)
cpu_s_1_worker       CPU seconds (user + system, every thread) of the 1-worker prepare's process
workers_speedup_ceiling  cores x the 1-worker wall / cpu_s_1_worker: the most 2 workers can
                     gain on these cores while doing the same work (they cannot finish
                     before that work divided by the cores); below 1.7 the target is out of
                     reach on this machine whatever the fan-out does
busy_s_2_workers     non-idle CPU seconds of the whole machine during the 2-worker prepare
                     (/proc/stat; nothing else running): its work plus the fan-out's own
                     cost (Dagster's per-step process, events, compute-log capture)
workers_speedup_core_each  the same with one core per worker: the 1-worker prepare pinned
                     to one core (sched_setaffinity, inherited by the tokenizer's threads)
                     / the 2-worker prepare on 2 cores; how the tasks scale with the cores
                     they are given
worker_peak_rss_mb   the largest peak RSS (MiB) of any task's step process (clean_file_group,
                     lsh_buckets, write_clean_part, tokenize_part) at a quarter of the corpus
                     and at all of it, same data.task_bytes; memory_growth_4x = full / quarter
dedup_recall         planted pairs at Jaccard >= 0.8 whose later copy was removed
dedup_false_removal  documents removed without a planted partner at Jaccard >= 0.5
datatrove_agreement  documents with the same keep/remove decision as datatrove's four
                     MinHash stages, both at datatrove's geometry (14 bands x 8 rows) and
                     without our signature verification (a bucket collision is a duplicate,
                     as in datatrove)
vs_datatrove_throughput  our clean_documents (2 processes) MB/s / datatrove's (2 workers)

Each prepare runs in a Python process of its own: tokenizers sizes its thread pool once per
process, so an in-process run after a pinned one kept the pinned run's single thread (the
2026-12-05 run's second round: its 1-worker prepare 426 s against 376 s in the first).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from fm_pipeline.data.planted import VOCAB, planted_near_duplicates

DATATROVE_PINS = ["datatrove==0.10.1", "spacy>=3.7,<4", "orjson", "xxhash<4"]  # xxhash 4 refuses str
FILES = 32
TARGETS = {"workers_speedup": 1.7, "memory_growth_4x": 1.25, "dedup_recall": 0.95,
           "datatrove_agreement": 0.99, "vs_datatrove_throughput": 1.0}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- corpus --------------------------------------------------------------------------------

def write_corpus(folder: Path, megabytes: float, seed: int = 3) -> dict:
    """~`megabytes` of JSONL in FILES files; returns the planted truth."""
    rng = np.random.default_rng(seed)
    vocab = np.array(VOCAB)
    n = int(megabytes * 1e6 / 1650)  # ~275 words of ~6 characters per document
    n_pairs = n // 40  # originals with a planted variant: 5% of documents are variants
    docs, pairs = planted_near_duplicates(n_pairs, seed=seed, words=(150, 400))
    # 2 x n_pairs random slots, paired at random; the earlier slot of a pair holds the original
    slots = np.full(n, -1, np.int64)
    chosen = rng.permutation(rng.choice(n, size=2 * n_pairs, replace=False)).reshape(-1, 2)
    chosen.sort(axis=1)
    slots[chosen[:, 0]] = 2 * np.arange(n_pairs)
    slots[chosen[:, 1]] = 2 * np.arange(n_pairs) + 1
    ids = [f"d{i:08d}" for i in range(n)]
    folder.mkdir(parents=True)
    per_file = -(-n // FILES)
    for f in range(FILES):
        with open(folder / f"part-{f:03d}.jsonl", "w") as out:
            for i in range(f * per_file, min(n, (f + 1) * per_file)):
                if slots[i] >= 0:
                    text = docs[slots[i]]
                else:
                    text = " ".join(vocab[rng.integers(0, len(vocab), rng.integers(150, 400))])
                out.write(json.dumps({"id": ids[i], "text": text}) + "\n")
    where = {int(s): ids[i] for i, s in enumerate(slots) if s >= 0}
    truth = [(where[a], where[b], sim) for a, b, sim in pairs]
    return {"documents": n, "pairs": truth,
            "bytes": sum(p.stat().st_size for p in folder.glob("*.jsonl"))}


# --- ours, through Dagster ------------------------------------------------------------------

@contextlib.contextmanager
def cores(n: int | None):
    """This process on its first n cores, and so the run's process it starts and every
    process that one starts."""
    if n is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:n])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def job_spec(corpus: Path, task_bytes: int, workers: int, **near) -> dict:
    from fm_pipeline.data.testing import small_job

    near_dedup = {"ngram": 5, "bands": 32, "rows": 4, "threshold": 0.7, **near}
    job = small_job(**{
        "data.sources": [{"name": "web", "uri": str(corpus), "format": "jsonl",
                          "text_field": "text", "weight": 1.0}],
        "data.near_dedup": near_dedup, "data.task_bytes": task_bytes, "data.workers": workers,
        "data.shard_tokens": 1 << 22, "data.heldout_fraction": 0.01, "data.min_chars": 64,
        "model.vocab_size": 4096, "model.size": "tiny", "training.seq_len": 512,
    })
    return job


def run_dagster(job, root: Path, assets: list[str] | None = None) -> dict:
    """One data_mix_job run (or just `assets`) in a fresh store and a fresh Python process:
    what a run sets up once per process must not carry into the next (tokenizers sizes its
    thread pool once, by the cores the process saw first; the executor keeps its
    forkserver). Returns wall, per-step RSS, tasks, the store."""
    spec = root / "job.yaml"
    spec.write_text(yaml.safe_dump(job.model_dump(mode="json", by_alias=True)))
    out = subprocess.run([sys.executable, "-m", "benchmarks.data_stages", "--one-run", str(root),
                          *(["--assets", ",".join(assets)] if assets else [])],
                         stdout=subprocess.PIPE, text=True, check=False)  # its log to ours
    if out.returncode:
        raise SystemExit(f"data_mix_job failed in {root} (exit {out.returncode})")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "store": root / "store"}


def one_run(root: Path, assets: list[str] | None) -> dict:
    """run_dagster's child: data_mix_job over root/job.yaml into root/store."""
    from dagster import AssetKey, DagsterEventType, execute_job, instance_for_test, reconstructable
    from fm_pipeline.assets.data import data_run_config
    from fm_pipeline.config import load_job

    from fm_pipeline.cli.data_workers import data_mix_job_def

    spec = root / "job.yaml"
    config = {**data_run_config(load_job(spec)), "resources": {
        "job_spec": {"config": {"path": str(spec)}},
        "store": {"config": {"uri": str(root / "store")}}}}
    (root / "dagster").mkdir()
    with instance_for_test(temp_dir=str(root / "dagster")) as instance:
        cpu0, busy0 = process_cpu_s(), machine_busy_s()
        t0 = time.perf_counter()
        result = execute_job(reconstructable(data_mix_job_def), instance=instance,
                             run_config=config,
                             asset_selection=[AssetKey(a) for a in assets] if assets else None)
        wall = time.perf_counter() - t0
        cpu = process_cpu_s() - cpu0
        busy = machine_busy_s() - busy0
        if not result.success:
            raise SystemExit(f"data_mix_job failed in {root}")
        rss: dict[str, float] = {}
        tasks = sum(e.dagster_event.step_key.startswith("clean_documents.clean_file_group[")
                    for e in instance.all_logs(result.run_id, of_type=DagsterEventType.STEP_SUCCESS))
        for e in instance.all_logs(result.run_id, of_type=DagsterEventType.STEP_OUTPUT):
            meta = e.dagster_event.step_output_data.metadata
            if "peak_rss_mib" in meta:
                kind = step_kind(e.dagster_event.step_key)
                rss[kind] = max(rss.get(kind, 0.0), float(meta["peak_rss_mib"].value))
        stages = stage_spans(instance.all_logs(result.run_id), wall)
    return {"wall_s": wall, "rss": rss, "tasks": tasks, "cpu_s": cpu, "busy_s": busy,
            "stages": stages}


STAGES = ("clean_file_group", "tokenizer", "tokenize_part")


def step_kind(step_key: str) -> str:
    """The op of a step: "clean_documents.clean_file_group[web_00003]" -> "clean_file_group"."""
    return step_key.split(".")[-1].split("[")[0]


def stage_spans(events, wall: float) -> dict[str, float]:
    """Seconds from the first step of each of STAGES starting to its last one finishing
    (the tokenizer's training is one step), and the rest of the wall."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for e in events:
        kind = step_kind(e.step_key or "")
        if kind in STAGES and e.dagster_event is not None:
            if e.dagster_event.event_type_value == "STEP_START":
                first[kind] = min(first.get(kind, e.timestamp), e.timestamp)
            elif e.dagster_event.event_type_value == "STEP_SUCCESS":
                last[kind] = max(last.get(kind, e.timestamp), e.timestamp)
    spans = {k: round(last[k] - first[k], 1) for k in STAGES if k in first and k in last}
    return {**spans, "rest": round(wall - sum(spans.values()), 1)}


def process_cpu_s() -> float:
    """User + system seconds of this process (all its threads) and of its reaped children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def machine_busy_s() -> float:
    """Non-idle CPU seconds of the whole machine since boot (/proc/stat's first line: user,
    nice, system, idle, iowait, irq, softirq, steal, in clock ticks)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def kept_doc_ids(store: Path, job) -> set[str]:
    """Our doc ids (file:line) of the documents in the clean parts."""
    import pyarrow.parquet as pq

    from fm_pipeline.data import mix_key
    from fm_pipeline.data.corpus import CleanReceipt, read_receipt
    from fm_pipeline.data.manifest import clean_receipt_key
    from fm_pipeline.storage import open_store

    s = open_store(store)
    receipt = read_receipt(s, clean_receipt_key(mix_key(job)), CleanReceipt)
    kept = set()
    for key in receipt.parts["web"]:
        kept.update(pq.read_table(s.local_path(key), columns=["doc_id"]).column(0).to_pylist())
    return kept


def doc_ids_of(ours: set[str], corpus: Path) -> set[str]:
    """Our doc_id is file:line for JSONL; map back to the corpus's "id" field."""
    out = set()
    for path in sorted(corpus.glob("*.jsonl")):
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                if f"{path.name}:{lineno}" in ours:
                    out.add(json.loads(line)["id"])
    return out


def all_ids(corpus: Path) -> list[str]:
    return [json.loads(line)["id"] for p in sorted(corpus.glob("*.jsonl")) for line in open(p)]


# --- datatrove -----------------------------------------------------------------------------

def datatrove_path() -> Path:
    """datatrove and what its English MinHash needs, installed beside the project for this
    benchmark only (pip --target; never a dependency)."""
    home = Path(os.environ.get("FM_HOME", ".fm"))
    target = home / "bench-deps" / "datatrove"
    if not (target / "datatrove").is_dir():
        log(f"installing {' '.join(DATATROVE_PINS)} into {target}")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target),
                        *DATATROVE_PINS], check=True)
    return target


def run_datatrove(corpus: Path, work: Path, *, tasks: int, workers: int, bands: int, rows: int,
                  tokenizer: str = "regex") -> dict:
    """datatrove's four stages in a process of their own; `regex`: words split as ours."""
    env = {**os.environ, "PYTHONPATH": str(datatrove_path())}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("datatrove_minhash.py")), str(corpus),
         str(work), "--tasks", str(tasks), "--workers", str(workers), "--bands", str(bands),
         "--rows", str(rows), "--tokenizer", tokenizer], env=env, capture_output=True,
        text=True, check=False)
    if out.returncode:
        raise SystemExit(f"datatrove failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- main ----------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=256.0, help="megabytes of corpus")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-datatrove", action="store_true")
    ap.add_argument("--one-run", type=Path, help=argparse.SUPPRESS)  # run_dagster's child
    ap.add_argument("--assets", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_run:
        print(json.dumps(one_run(args.one_run, args.assets.split(",") if args.assets else None)))
        return

    with tempfile.TemporaryDirectory(prefix="fm-bench-stages-") as tmp:
        root = Path(tmp)
        log(f"writing a {args.mb:.0f} MB corpus and a quarter of it")
        full = write_corpus(root / "corpus", args.mb)
        # Two of the FILES files per cleaning task at full size (16 tasks): task_bytes a
        # little over two files' bytes, since the files differ by a few documents.
        task_bytes = int(full["bytes"] / (FILES // 2) * 1.1)
        write_corpus(root / "quarter", args.mb / 4, seed=4)
        mb = full["bytes"] / 1e6

        rss_full: dict[str, float] = {}
        recall = false_removal = None
        # (workers, cores): every core, then one core per worker; on 2 cores the 2-worker
        # run with every core is already the one with a core per worker.
        kinds = [(1, None), (2, None), (1, 1)] + ([(2, 2)] if len(os.sched_getaffinity(0)) > 2 else [])
        walls: dict[tuple, list[float]] = {k: [] for k in kinds}
        stages: dict[tuple, list[dict]] = {k: [] for k in kinds}
        cpu_1: list[float] = []  # the 1-worker prepares' own CPU seconds
        busy_2: list[float] = []  # the machine's during the 2-worker prepares
        for r in range(args.repeats):
            for workers, ncores in kinds if r % 2 == 0 else kinds[::-1]:  # alternate the order
                run_dir = root / f"run-{r}-{workers}-{ncores}"
                run_dir.mkdir()
                log(f"round {r + 1}/{args.repeats}: the whole prepare with {workers} worker(s)"
                    + (f" on {ncores} core(s)" if ncores else ""))
                with cores(ncores):
                    out = run_dagster(job_spec(root / "corpus", task_bytes, workers), run_dir)
                walls[workers, ncores].append(out["wall_s"])
                stages[workers, ncores].append(out["stages"])
                if ncores is None and workers == 1:
                    cpu_1.append(out["cpu_s"])
                elif ncores is None:
                    busy_2.append(out["busy_s"])
                tasks = out["tasks"]
                log(f"  {out['wall_s']:.1f} s ({mb / out['wall_s']:.2f} MB/s; CPU {out['cpu_s']:.0f} s "
                    f"in its process, {out['busy_s']:.0f} s machine-wide)")
                if workers == 2:
                    rss_full = {k: max(v, rss_full.get(k, 0)) for k, v in out["rss"].items()}
                    if recall is None:
                        job = job_spec(root / "corpus", task_bytes, 2)
                        kept = doc_ids_of(kept_doc_ids(out["store"], job), root / "corpus")
                        recall, false_removal = dedup_quality(full, kept, root / "corpus")
                shutil.rmtree(run_dir)

        log("peak memory per worker at a quarter of the corpus (same task_bytes)")
        qdir = root / "run-quarter"
        qdir.mkdir()
        rss_quarter = run_dagster(job_spec(root / "quarter", task_bytes, 2), qdir,
                                  ["clean_documents", "tokenizer", "token_shards"])["rss"]
        shutil.rmtree(qdir)

        versus = {}
        if not args.no_datatrove:
            versus = compare_datatrove(root, full, task_bytes)

    two_on_two = walls.get((2, 2)) or walls[2, None]
    ratios = [a / b for a, b in zip(walls[1, None], walls[2, None], strict=True)]
    per_core = [a / b for a, b in zip(walls[1, 1], two_on_two, strict=True)]
    ncores = len(os.sched_getaffinity(0))
    ceilings = [ncores * w / c for w, c in zip(walls[1, None], cpu_1, strict=True)]
    # the median round's seconds per stage: clean, tokenizer training, tokenizing, rest
    stage_s = {name: median_round(stages[kind], walls[kind]) for name, kind in
               (("1_worker", (1, None)), ("2_workers", (2, None)), ("1_worker_1_core", (1, 1)))}
    walls = {1: walls[1, None], 2: walls[2, None], "1@1": walls[1, 1]}
    med = statistics.median
    peak_q, peak_f = max(rss_quarter.values()), max(rss_full.values())
    result = {
        "benchmark": "data_stages",
        "corpus_mb": round(mb, 1),
        "documents": full["documents"],
        "tasks": tasks,  # cleaning tasks (file groups); as many tokenizing tasks
        "prepare_s_1_worker": round(med(walls[1]), 2),
        "prepare_s_2_workers": round(med(walls[2]), 2),
        "docs_per_s_1_worker": round(full["documents"] / med(walls[1])),
        "docs_per_s_2_workers": round(full["documents"] / med(walls[2])),
        "mb_per_s_1_worker": round(mb / med(walls[1]), 2),
        "mb_per_s_2_workers": round(mb / med(walls[2]), 2),
        "workers_speedup": round(med(ratios), 3),
        "workers_speedup_spread": round(max(ratios) - min(ratios), 3),
        "cpu_s_1_worker": round(med(cpu_1), 1),
        "workers_speedup_ceiling": round(med(ceilings), 3),
        "busy_s_2_workers": round(med(busy_2), 1),
        "stage_s": stage_s,
        "prepare_s_1_worker_1_core": round(med(walls["1@1"]), 2),
        "workers_speedup_core_each": round(med(per_core), 3),
        "workers_speedup_core_each_spread": round(max(per_core) - min(per_core), 3),
        "cores": ncores,
        "worker_peak_rss_mb": {"quarter": rss_quarter, "full": rss_full},
        "memory_growth_4x": round(peak_f / peak_q, 3),
        "dedup_recall": round(recall, 4),
        "dedup_false_removal": round(false_removal, 5),
        **versus,
        "repeats": args.repeats,
    }
    result["targets_met"] = {
        "workers_speedup": result["workers_speedup"] >= TARGETS["workers_speedup"],
        "memory_growth_4x": result["memory_growth_4x"] <= TARGETS["memory_growth_4x"],
        "dedup_recall": recall >= TARGETS["dedup_recall"],
        "dedup_false_removal": false_removal == 0,
    }
    if versus:
        result["targets_met"]["datatrove_agreement"] = versus["datatrove_agreement"] >= TARGETS["datatrove_agreement"]
        result["targets_met"]["vs_datatrove_throughput"] = versus["vs_datatrove_throughput"] >= TARGETS["vs_datatrove_throughput"]
    print(json.dumps(result))


def median_round(rounds: list[dict], walls: list[float]) -> dict:
    """The stage seconds of the round whose wall is the median (the lower one of two)."""
    order = sorted(range(len(walls)), key=walls.__getitem__)
    return rounds[order[(len(order) - 1) // 2]]


def dedup_quality(corpus: dict, kept: set[str], folder: Path) -> tuple[float, float]:
    high = [(a, b) for a, b, s in corpus["pairs"] if s >= 0.8]
    recall = sum(b not in kept for _, b in high) / len(high)
    partnered = {b for _, b, s in corpus["pairs"] if s >= 0.5}
    innocent = [i for i in all_ids(folder) if i not in partnered]
    false_removal = sum(i not in kept for i in innocent) / len(innocent)
    return recall, false_removal


def compare_datatrove(root: Path, corpus: dict, task_bytes: int) -> dict:
    """Both at datatrove's default geometry, 2 processes, verification off on our side."""
    mb = corpus["bytes"] / 1e6
    log("ours at datatrove's geometry (14 x 8, a bucket collision is a duplicate)")
    ours_dir = root / "ours-dt"
    ours_dir.mkdir()
    job = job_spec(root / "corpus", task_bytes, 2, bands=14, rows=8, threshold=0.01)
    ours = run_dagster(job, ours_dir, ["clean_documents"])
    kept = doc_ids_of(kept_doc_ids(ours["store"], job), root / "corpus")
    shutil.rmtree(ours_dir)
    log("datatrove's MinHash pipeline, 2 workers")
    theirs = run_datatrove(root / "corpus", root / "datatrove", tasks=16, workers=2, bands=14, rows=8)
    ids = all_ids(root / "corpus")
    removed_theirs = set(theirs["removed"])
    same = sum((i in kept) == (i not in removed_theirs) for i in ids)
    return {
        "datatrove_agreement": round(same / len(ids), 5),
        "datatrove_removed": len(removed_theirs),
        "ours_removed_at_datatrove_geometry": len(ids) - len(kept),
        "clean_documents_s": round(ours["wall_s"], 2),
        "datatrove_s": round(theirs["wall_s"], 2),
        "vs_datatrove_throughput": round((mb / ours["wall_s"]) / (mb / theirs["wall_s"]), 3),
    }


if __name__ == "__main__":
    main()
