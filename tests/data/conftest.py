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
