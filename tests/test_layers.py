"""The domain core never pulls in Dagster: it runs inside torchrun workers."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

DAGSTER_LAYER = {"definitions.py", "assets", "resources", "cli"}


def test_domain_core_imports_without_dagster():
    modules = []
    for path in sorted((REPO / "fm_pipeline").rglob("*.py")):
        rel = path.relative_to(REPO / "fm_pipeline")
        if rel.parts[0] in DAGSTER_LAYER:
            continue
        mod = ".".join(("fm_pipeline", *rel.with_suffix("").parts)).removesuffix(".__init__")
        if mod.endswith("__main__"):
            continue
        modules.append(mod)
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'dagster_pipes_x'))\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]


def test_dagster_layer_installs_under_fm_pipeline():
    import fm_pipeline.assets
    import fm_pipeline.resources

    assert fm_pipeline.assets.__file__.startswith(str(REPO / "assets"))
    assert fm_pipeline.resources.__file__.startswith(str(REPO / "resources"))


# Floors, ground first: a package may import its own floor and the ones below, never above,
# at module level or inside a function (a lazy import is an import all the same).
FLOORS = [
    {"storage", "model", "accelerators", "cpu_peaks", "plotting", "defaults", "lazy"},
    {"config", "tracking"},
    {"catalog", "rundir", "data", "parallel", "planner"},
    {"checkpoint", "stragglers", "launch", "report", "scheduling"},
    {"train", "eval", "orchestration", "sim"},
    {"resilience", "api", "deploy"},
    {"resources", "cli", "assets", "definitions"},  # the Dagster layer and the entry points
]
FLOOR = {pkg: n for n, floor in enumerate(FLOORS) for pkg in floor}
SOURCES = (("fm_pipeline", "fm_pipeline"), ("assets", "fm_pipeline.assets"),
           ("resources", "fm_pipeline.resources"))


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "fm_pipeline" and len(parts) > 1 else None


def _imports():
    """(file, line, importing package, imported package) for every fm_pipeline import."""
    import ast

    for root, dotted in SOURCES:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO / root).with_suffix("").parts
            src = _package(".".join((dotted, *rel)))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    targets = [node.module]
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                else:
                    continue
                for target in targets:
                    dst = _package(target)
                    if dst and dst != src:
                        yield path.relative_to(REPO), node.lineno, src, dst


def test_every_package_has_a_floor():
    packages = {p.name.removesuffix(".py") for p in (REPO / "fm_pipeline").iterdir()
                if (p.is_dir() and (p / "__init__.py").is_file()) or
                (p.suffix == ".py" and p.name != "__init__.py")}
    assert packages - FLOOR.keys() <= {"assets", "resources"} and not (
        FLOOR.keys() - packages - {"assets", "resources"}), sorted(packages ^ FLOOR.keys())


def test_no_import_runs_from_a_lower_floor_to_a_higher_one():
    upward = [f"{path}:{line}: {src} (floor {FLOOR[src] + 1}) imports {dst} "
              f"(floor {FLOOR[dst] + 1})" for path, line, src, dst in _imports()
              if FLOOR[dst] > FLOOR[src]]
    assert not upward, "\n".join(upward)
