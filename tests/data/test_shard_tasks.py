"""Token shards as tasks, one per clean part: each part is encoded and cut on its own, the
published mix reads every whole window of every part, 4 parts hold exactly the tokens of 1,
and a stage killed (SIGKILL) between parts resumes part by part to the same shards."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest

from fm_pipeline.data import mix_key, open_mix
from fm_pipeline.data.errors import DataError
from fm_pipeline.data.pipeline import publish_stage, shards_stage, tokenizer_stage
from fm_pipeline.data.planted import planted_near_duplicates
from fm_pipeline.data.progress import ProgressSink
from fm_pipeline.data.shard_stages import finish_shards, part_receipt_key, shard_tasks
from fm_pipeline.data.shards import decode_shard
from fm_pipeline.storage import open_store
from tests.data.conftest import clean_corpus, corpus_job, run_killed

TASK_BYTES = 300_000  # the planted corpus (~1.2 MB of files) in 4 groups, so 4 clean parts


@pytest.fixture(scope="module")
def docs():
    return planted_near_duplicates(300, seed=11)[0]


def _prepared(root, docs, **data):
    job, store, _ = clean_corpus(root, {"web": docs}, near_dedup={}, **data)
    tokenizer_stage(job, store)
    return job, store


@pytest.fixture(scope="module")
def four(docs, tmp_path_factory):
    job, store = _prepared(tmp_path_factory.mktemp("four-parts"), docs, task_bytes=TASK_BYTES)
    return job, store, shards_stage(job, store)


def _stream(store, receipt, split: str) -> np.ndarray:
    shards = [s for s in receipt.shards["web"] if s.split == split]
    return np.concatenate([decode_shard(store.get_bytes(s.key), receipt.dtype) for s in shards])


def test_each_clean_part_is_a_task_with_its_own_shards(four):
    job, store, receipt = four
    tasks = shard_tasks(job, store)
    assert [t.name for t in tasks] == [f"web_{i:05d}" for i in range(4)]
    key = mix_key(job)
    for task in tasks:  # a receipt per task, naming its part's shards only
        done = json.loads(store.get_bytes(part_receipt_key(key, task)))
        assert done["documents"] > 0
        assert all(f"-p{task.part:05d}-" in s["key"] for s in done["shards"])
    # Each part's stream is cut on its own: whole windows per shard, the remainder unused.
    window = job.training.seq_len + 1
    manifest = publish_stage(job, store)
    (source,) = manifest.sources
    assert source.train_windows == sum(s.tokens // window for s in receipt.shards["web"]
                                       if s.split == "train")
    assert source.train_windows < receipt.tokens("web", "train") // window + 4
    mix = open_mix(store, key)
    mix.verify()
    # Every window of the last part reads back as the tokens its shard holds.
    last = [s for s in receipt.shards["web"] if s.split == "train"][-1]
    n = last.tokens // window
    expect = decode_shard(store.get_bytes(last.key), receipt.dtype)[: n * window]
    got = mix._gather("web", "train", np.arange(source.train_windows - n, source.train_windows))
    assert np.array_equal(got.reshape(-1), expect.astype(np.int64))


def test_four_parts_hold_exactly_the_tokens_of_one(docs, four, tmp_path):
    _, store4, receipt4 = four
    job1, store1 = _prepared(tmp_path, docs)
    receipt1 = shards_stage(job1, store1)
    assert len(shard_tasks(job1, store1)) == 1
    assert receipt1.tokenizer_sha256 == receipt4.tokenizer_sha256  # the same clean corpus
    for split in ("train", "heldout"):
        assert np.array_equal(_stream(store1, receipt1, split), _stream(store4, receipt4, split))


def test_finishing_refuses_a_part_that_has_not_run(four, tmp_path, docs):
    job, store = _prepared(tmp_path, docs, task_bytes=TASK_BYTES)
    with pytest.raises(DataError, match=r"shard task web_00000 .* has not finished"):
        finish_shards(job, store, shard_tasks(job, store))


class Encoded(ProgressSink):
    def __init__(self):
        self.parts: list[str] = []

    def start(self, task: str, *, total=None, unit: str = "") -> None:
        if task.startswith("tokenize "):
            self.parts.append(task.removeprefix("tokenize "))


def test_a_killed_shard_stage_resumes_part_by_part(docs, four, tmp_path):
    receipt4 = four[2]
    job = corpus_job(tmp_path, {"web": docs}, near_dedup={}, task_bytes=TASK_BYTES)
    store_dir = tmp_path / "killed"
    store = open_store(store_dir)
    from fm_pipeline.data.pipeline import clean_stage

    clean_stage(job, store)
    tokenizer_stage(job, store)
    run = run_killed(job, store_dir, stages="fm_pipeline.data.shard_stages",
                     stage="shards_stage", kind="ShardPartReceipt", nth=3)
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert not store.exists(f"data/{mix_key(job)}/shards/receipt.json")
    encoded = Encoded()
    resumed = shards_stage(job, store, progress=encoded)
    assert encoded.parts == ["web_00002", "web_00003"]  # two parts done before the kill
    def named(receipt):  # the mix keys differ (another corpus path), the shard names not
        return [(s.key.split("/shards/")[1], s.sha256) for s in receipt.shards["web"]]

    assert named(resumed) == named(receipt4)
