"""The README's layout table says which layouts run, and where: every layout the trainer's
tests train is in it, every test it cites exists, and every layout it says is not run here
is one the planner never prints as runnable."""

from __future__ import annotations

import ast
import re

from fm_pipeline.planner.layout import Layout
from fm_pipeline.planner.runnable import not_runnable
from fm_pipeline.planner.shape import named_shape
from tests.conftest import REPO
from tests.train.conftest import LAYOUTS

HEADING = "## Parallel layouts: where each runs"


def _rows() -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    assert HEADING in text, "README.md lost its layout table"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ")]
    assert rows[0] == ["layout", "job spec", "trains here", "resumes on another layout, here",
                       "on a GPU"], rows[0]
    return rows[1:]


def _tests_defined() -> dict[str, set[str]]:
    """file name -> the test functions it defines, over the whole tests tree."""
    found: dict[str, set[str]] = {}
    for path in (REPO / "tests").rglob("test_*.py"):
        names = {node.name for node in ast.parse(path.read_text()).body
                 if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
        found.setdefault(path.name, set()).update(names)
    return found


def test_every_trained_layout_is_in_the_table():
    # A test layout's name: lower case, digits and hyphens (`fsdp4`, `moe-pp2-ep2`).
    named = {name for row in _rows()
             for name in re.findall(r"`([a-z0-9]+(?:-[a-z0-9]+)*)`", row[2])}
    assert set(LAYOUTS) - named == set(), "layouts the tests train, missing from README"
    assert named - set(LAYOUTS) == set(), "README names test layouts that do not exist"


def test_every_cited_test_exists():
    defined = _tests_defined()
    cited = [ref for row in _rows() for cell in row
             for ref in re.findall(r"`(test_\w+\.py)::(test_\w+)`", cell)]
    assert len(cited) >= 10
    for file, test in cited:
        assert test in defined.get(file, set()), f"README cites {file}::{test}, which is gone"


def test_what_the_table_says_is_not_run_here_the_planner_never_calls_runnable():
    dense = named_shape("llama3-8b", seq_len=4096)
    moe = named_shape("mixtral-8x7b", seq_len=4096)
    # Each row the table says does not run here -> the planner's reasons for such a plan.
    refused = {
        "MoE with TP": not_runnable(moe, Layout(tp=2, ep=2, dp=4)),
        "context parallelism": not_runnable(dense, Layout(tp=1, cp=2, dp=4)),
        "ZeRO-2 as DeepSpeed runs it": not_runnable(dense, Layout(tp=1, dp=8, sharding="zero2")),
        "all-to-all overlap (1F1B, DualPipe)": not_runnable(moe, Layout(tp=1, ep=2, dp=4),
                                                            ep_overlap="1f1b"),
        "FP8 blockwise": not_runnable(dense, Layout(tp=1, dp=8), precision="fp8-blockwise"),
    }
    said_no = {row[0] for row in _rows() if row[2].startswith("no:")}
    assert said_no == set(refused), "a row says 'no:' without a planner check here, or lost it"
    for layout, why in refused.items():
        assert why, f"{layout}: the README says it does not run, the planner calls it runnable"
