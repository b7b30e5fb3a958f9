"""Every name a benchmark imports from the project still exists.

Benchmarks run by hand (`make bench`), not in CI, and import most of what they use inside
functions: a module moved or a function renamed surfaced only when someone next measured
(benchmarks.recovery still imported fm_pipeline.config.paths after the Site replaced it;
benchmarks.trainer called open_job_mix without its store). This reads every import
statement of benchmarks/*.py, at any depth, and resolves it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))
OURS = ("fm_pipeline", "benchmarks")


def _imports(path: Path) -> list[tuple[str, str | None]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in OURS:
            out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names
                    if alias.name.split(".")[0] in OURS]
    return out


def _missing(path: Path) -> list[str]:
    missing = []
    for module, name in _imports(path):
        try:
            imported = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{module}: {e}")
            continue
        if name is not None and not hasattr(imported, name):
            try:  # a submodule imported by name
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    return missing


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.stem)
def test_what_a_benchmark_imports_from_the_project_exists(path):
    missing = _missing(path)
    assert not missing, f"{path.name} imports what no longer exists: {missing}"


def test_a_moved_module_or_a_renamed_function_is_caught(tmp_path):
    planted = tmp_path / "bench.py"
    planted.write_text("def f():\n    from fm_pipeline.config.paths import runs_dir\n"
                       "    from fm_pipeline.config.site import Site, runs_dir\n")
    assert _missing(planted) == [
        "fm_pipeline.config.paths: No module named 'fm_pipeline.config.paths'",
        "fm_pipeline.config.site.runs_dir"]
