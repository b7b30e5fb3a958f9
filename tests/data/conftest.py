"""Fixtures for the data tests: one real small mix per session (prepared in ~2 s)."""

from __future__ import annotations

import pytest

from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.storage import open_store


@pytest.fixture(scope="session")
def small_mix(tmp_path_factory):
    """The small job's mix in a session store; tests must not modify it (copy it first)."""
    store = open_store(tmp_path_factory.mktemp("mix-store"))
    return build_small_mix(small_job(), store=store)


@pytest.fixture
def text_dir(tmp_path):
    """A directory of real prose documents: paragraphs of this interpreter's docstrings."""
    import json

    root = tmp_path / "texts"
    root.mkdir()
    docs = [json.__doc__, json.dumps.__doc__, json.loads.__doc__, json.JSONEncoder.__doc__,
            json.JSONDecoder.__doc__]
    for i, doc in enumerate(docs):
        (root / f"doc{i}.txt").write_text(doc, encoding="utf-8")
    return root


def make_job(sources: list[dict], *, seq_len: int = 16, vocab_size: int = 320, **data):
    """A small job around `sources` (dicts of SourceSpec fields)."""
    from fm_pipeline.data.testing import small_job

    overrides = {"data.sources": sources, "training.seq_len": seq_len, "model.vocab_size": vocab_size,
                 "data.min_chars": data.pop("min_chars", 8), "data.shard_tokens": data.pop("shard_tokens", 256)}
    overrides.update({f"data.{k}": v for k, v in data.items()})
    return small_job(**overrides)


def copy_mix(mix, tmp_path):
    """A private copy of a published mix (for tests that damage it)."""
    from fm_pipeline.data import open_mix

    store = open_store(tmp_path / "copy")
    for info in mix.store.list(f"data/{mix.key}/"):
        store.put_bytes(mix.store.get_bytes(info.key), info.key)
    return open_mix(store, mix.key)


def corpus_job(root, sources: dict[str, list[str]], **data):
    """Write each source's documents as text files under `root` (one per file, in order,
    named 00000.txt, ...); returns a small job over them."""
    specs = []
    for name, docs in sources.items():
        folder = root / name
        folder.mkdir(parents=True)
        for i, doc in enumerate(docs):
            (folder / f"{i:05d}.txt").write_bytes(doc if isinstance(doc, bytes) else doc.encode())
        specs.append({"name": name, "uri": str(folder), "format": "text",
                      "weight": round(1 / len(sources), 12)})
    if len(specs) > 1:
        specs[-1]["weight"] = round(1 - sum(s["weight"] for s in specs[:-1]), 12)
    return make_job(specs, **data)


def clean_corpus(root, sources: dict[str, list[str]], **data):
    """corpus_job's files through the cleaning stage; returns (job, store, receipt)."""
    from fm_pipeline.data.pipeline import clean_stage

    job = corpus_job(root, sources, **data)
    store = open_store(root / "store")
    return job, store, clean_stage(job, store)


def kept_texts(job, store, source: str, split: str | None = None) -> list[str]:
    from fm_pipeline.data import mix_key
    from fm_pipeline.data.corpus import iter_clean_texts

    return [t for b in iter_clean_texts(store, mix_key(job), source, split=split) for t in b]


KILL_AT_RECEIPT = """
import importlib, json, os, signal, sys
from fm_pipeline.config import parse_job
from fm_pipeline.storage import open_store

stages = importlib.import_module(sys.argv[1])
stage = getattr(importlib.import_module("fm_pipeline.data.pipeline"), sys.argv[2])
kind, nth, spec, store = sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
seen, write = [], stages.write_receipt

def write_receipt(store, key, receipt):  # killed just before the nth receipt of a kind
    if type(receipt).__name__ == kind:
        seen.append(key)
        if len(seen) == nth:
            os.kill(os.getpid(), signal.SIGKILL)
    write(store, key, receipt)

stages.write_receipt = write_receipt
stage(parse_job(json.loads(spec), source="<killed run>"), open_store(store))
"""


def run_killed(job, store_dir, *, stages: str, stage: str, kind: str, nth: int):
    """`fm_pipeline.data.pipeline.<stage>` in a subprocess, SIGKILLed just before module
    `stages` writes its `nth` receipt of type `kind`."""
    import json
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-c", KILL_AT_RECEIPT, stages, stage, kind, str(nth),
         json.dumps(job.model_dump(mode="json", by_alias=True)), str(store_dir)],
        capture_output=True, text=True, timeout=300, check=False)
