"""The README's benchmark table is exactly what the committed fixtures render, so no figure
in it can drift from a measured JSON; a planted drift fails; every row says how many repeats
and the day it ran."""

from __future__ import annotations

import re
import shutil

import pytest

from benchmarks.table import README_END, README_START, readme_table, render, with_table
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "bench_fixtures"
README = REPO / "README.md"


def test_the_readme_table_is_the_fixtures_rendered():
    assert readme_table(README.read_text()) == render(FIXTURES), (
        "README.md's benchmark table differs from tests/bench_fixtures: run make readme-table")


def test_a_planted_drift_is_caught(tmp_path):
    text = README.read_text()
    drifted = text.replace("tokenize_ratio_vs_fast 0.950", "tokenize_ratio_vs_fast 0.990", 1)
    assert drifted != text
    assert readme_table(drifted) != render(FIXTURES)
    # ... and a changed fixture is caught the same way.
    for path in FIXTURES.glob("*.json"):
        shutil.copy(path, tmp_path)
    fixture = tmp_path / "simulation.json"
    before = fixture.read_text()
    fixture.write_text(before.replace('"ettr": 0.9068', '"ettr": 0.95'))
    assert fixture.read_text() != before
    assert readme_table(text) != render(tmp_path)
    with pytest.raises(ValueError, match="no benchmark table"):
        readme_table(text.replace(README_END, ""))
    assert readme_table(with_table(drifted, render(FIXTURES))) == render(FIXTURES)


def test_every_row_says_its_repeats_and_its_day():
    rows = [line for line in render(FIXTURES).splitlines() if line.startswith("| `benchmarks.")]
    assert len(rows) == 13
    for row in rows:
        if "| not run |" in row:
            continue
        assert re.search(r"\d+ (runs?|rounds|seeds|jobs)", row), row
        assert re.search(r"\| 20\d\d-\d\d-\d\d \|$", row), row


def test_figures_outside_the_table_are_not_copies_of_it():
    # The status table once said 1.22x for the data workers while the benchmark table said
    # 1.405: figures live in the benchmark table, prose points at it.
    text = README.read_text()
    outside = text.replace(readme_table(text), "")
    assert README_START in outside
    for figure in re.findall(r"workers_speedup (\d\.\d+)", readme_table(text)):
        assert f"{figure}x" not in outside
    assert "1.22x" not in outside
