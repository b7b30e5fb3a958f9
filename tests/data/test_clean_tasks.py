"""Cleaning as tasks over file groups, through the stored stages (plan -> clean tasks -> LSH
bucket tasks -> clusters -> clean parts): the planted near-duplicates are removed with the
issue's recall, the same documents survive with 1 and with 4 tasks, and a run killed
(SIGKILL) in the middle of a stage resumes task by task to the same result."""

from __future__ import annotations

import signal

import pyarrow.parquet as pq
import pytest

from fm_pipeline.data import mix_key
from fm_pipeline.data.pipeline import clean_stage
from fm_pipeline.data.planted import planted_near_duplicates
from fm_pipeline.data.progress import ProgressSink
from fm_pipeline.storage import open_store
from tests.data.conftest import clean_corpus, corpus_job, run_killed

TASK_BYTES = 300_000  # the planted corpus (~1.2 MB of files) in 4 groups


@pytest.fixture(scope="module")
def planted():
    return planted_near_duplicates(300, seed=11)


@pytest.fixture(scope="module")
def one_task(planted, tmp_path_factory):
    return clean_corpus(tmp_path_factory.mktemp("one-task"), {"web": planted[0]}, near_dedup={})


def kept_ids(store, receipt, source: str = "web") -> dict[str, list[str]]:
    """doc ids per split, in order, from the clean parts."""
    out: dict[str, list[str]] = {"train": [], "heldout": []}
    for key in receipt.parts[source]:
        table = pq.read_table(store.local_path(key), columns=["doc_id", "split"]).to_pylist()
        for row in table:
            out[row["split"]].append(row["doc_id"])
    return out


def index_of(doc_id: str) -> int:
    return int(doc_id.split(".")[0])  # "00042.txt" -> 42 (clean_corpus writes one per file)


def test_planted_near_duplicates_are_removed_through_the_stages(planted, one_task):
    docs, pairs = planted
    _, store, receipt = one_task
    kept = {index_of(i) for ids in kept_ids(store, receipt).values() for i in ids}
    high = [p for p in pairs if p[2] >= 0.8]
    low = [p for p in pairs if p[2] < 0.5]
    assert len(high) > 50 and len(low) > 50
    assert sum(b not in kept for _, b, _ in high) / len(high) >= 0.95
    assert all(b in kept for _, b, _ in low)  # no false removal below 0.5
    assert all(a in kept for a, _, _ in pairs)  # the first of each cluster stays
    dropped = receipt.sources["web"].dropped  # a variant with no edit is an exact copy
    assert dropped["near_duplicate"] + dropped.get("duplicate", 0) == len(docs) - len(kept)


def test_four_tasks_keep_what_one_task_keeps(planted, one_task, tmp_path):
    _, store1, one = one_task
    job4, store4, four = clean_corpus(tmp_path, {"web": planted[0]}, near_dedup={},
                                      task_bytes=TASK_BYTES)
    assert (one.tasks, four.tasks) == (1, 4)
    whole = job4.model_copy(update={"data": job4.data.model_copy(update={"task_bytes": 1 << 40})})
    assert mix_key(job4) == mix_key(whole)  # how the work is cut is not part of the mix
    assert len(four.parts["web"]) == 4
    assert kept_ids(store4, four) == kept_ids(store1, one)
    assert four.sources == one.sources


class ReadCounter(ProgressSink):
    def __init__(self):
        self.documents = 0

    def advance(self, task: str, amount: float = 1) -> None:
        if task.startswith("clean "):
            self.documents += amount


@pytest.mark.parametrize("kind, nth, reread", [
    ("TaskReceipt", 3, "the third group"),   # cleaning: two groups done, the third written
    ("DedupReceipt", 1, "nothing"),          # clusters decided, receipt not yet written
    ("FinalReceipt", 2, "nothing"),          # one clean part done, the second written
])
def test_a_killed_stage_resumes_task_by_task_to_the_same_result(
        planted, one_task, tmp_path, kind, nth, reread):
    _, store1, one = one_task
    job = corpus_job(tmp_path, {"web": planted[0]}, near_dedup={}, task_bytes=TASK_BYTES)
    store_dir = tmp_path / "killed"
    run = run_killed(job, store_dir, stages="fm_pipeline.data.clean_stages", stage="clean_stage",
                     kind=kind, nth=nth)
    assert run.returncode == -signal.SIGKILL, run.stderr
    store = open_store(store_dir)
    assert not store.exists(f"data/{mix_key(job)}/clean/receipt.json")
    counter = ReadCounter()
    resumed = clean_stage(job, store, progress=counter)
    assert kept_ids(store, resumed) == kept_ids(store1, one)
    assert resumed.sources == one.sources
    total = len(planted[0])
    if reread == "nothing":
        assert counter.documents == 0
    else:  # only the unfinished groups (the third and fourth of four) are read again
        assert 0 < counter.documents < total * 0.75
