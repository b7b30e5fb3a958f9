"""The rules of the rooms (docs/architecture.md): the domain core never pulls in Dagster (it
runs inside torchrun workers); a package imports its own floor and the floors below, never
above; no module reaches itself through its imports (shown failing on a planted circle)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

DAGSTER_LAYER = {"definitions.py", "assets", "resources", "cli", "dagster_runs"}


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


def imported(tree, *, submodules: bool = False, skip=frozenset()):
    """(line, module) of every absolute import in `tree`, nested ones included, except nodes
    in `skip`; `submodules`: `from a import b` also as a.b (b may be a module)."""
    import ast

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = ([f"{node.module}.{a.name}" for a in node.names] if submodules
                     else [node.module])
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            yield node.lineno, name


def dagster_imports(root: Path, dotted: str, allowed: set[str]) -> list[str]:
    """'file:line: module' for every import of Dagster (dagster, dagster_k8s, ...; the
    Dagster-free dagster_pipes aside), lazy ones included, in a module of `root` whose first
    part below it is not in `allowed`."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in allowed:
            continue
        found += [f"{dotted}/{rel}:{line}: {n}" for line, n in
                  imported(ast.parse(path.read_text(encoding="utf-8")))
                  if n.split(".")[0].startswith("dagster") and n.split(".")[0] != "dagster_pipes"]
    return found


def test_no_dagster_import_outside_the_dagster_layer_and_the_entry_points():
    found = dagster_imports(REPO / "fm_pipeline", "fm_pipeline", DAGSTER_LAYER)
    assert not found, "\n".join(found)


def test_a_planted_lazy_dagster_import_is_found(tmp_path):
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "render.py").write_text(
        "def render():\n    from dagster_k8s.job import construct_dagster_k8s_job\n")
    (tmp_path / "train.py").write_text("from dagster_pipes import open_dagster_pipes\n")
    assert dagster_imports(tmp_path, "planted", set()) == [
        "planted/launch/render.py:2: dagster_k8s.job"]


def test_dagster_layer_installs_under_fm_pipeline():
    import fm_pipeline.assets
    import fm_pipeline.resources

    assert fm_pipeline.assets.__file__.startswith(str(REPO / "assets"))
    assert fm_pipeline.resources.__file__.startswith(str(REPO / "resources"))


# Floors, ground first: a package may import its own floor and the ones below, never above,
# at module level or inside a function (a lazy import is an import all the same).
FLOORS = [
    {"storage", "model", "accelerators", "cluster_defaults", "cpu_peaks", "plotting",
     "defaults", "lazy", "failpoints"},
    {"config", "tracking"},
    {"catalog", "rundir", "data", "parallel", "planner"},
    {"checkpoint", "stragglers", "launch", "report", "scheduling"},
    {"train", "eval", "orchestration", "sim"},
    {"resilience", "api", "deploy", "devcluster"},
    {"dagster_runs"},  # a job's Dagster runs: names, requests, records, the API's orchestrator
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
            for line, target in imported(ast.parse(path.read_text(encoding="utf-8"))):
                dst = _package(target)
                if dst and dst != src:
                    yield path.relative_to(REPO), line, src, dst


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


# -- circles: no module reaches itself through its imports ------------------------------------

def module_graph(sources: tuple[tuple[Path, str], ...]) -> dict[str, set[str]]:
    """module -> the project's modules it imports, anywhere in its body (a lazy import is an
    import), except under `if TYPE_CHECKING:` (never run)."""
    import ast

    files = {}
    for root, dotted in sources:
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join((dotted, *parts)).removesuffix(".__init__")] = path
    top = {dotted.split(".")[0] for _, dotted in sources}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        edges = set()
        for _, name in imported(tree, submodules=True, skip=skipped):
            if name.split(".")[0] in top and (target := resolve(name)) != module:
                edges.add(target)
        graph[module] = edges - {None}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_module_reaches_itself_through_its_imports():
    sources = tuple((REPO / root, dotted) for root, dotted in SOURCES)
    found = circles(module_graph(sources))
    assert not found, "\n".join(" <-> ".join(group) for group in found)


def test_a_planted_circle_is_found_even_through_a_lazy_import(tmp_path):
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from planted.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from planted import c\n")
    (pkg / "c.py").write_text("import planted.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from planted import a\n")
    graph = module_graph(((pkg, "planted"),))
    assert circles(graph) == [["planted.a", "planted.b", "planted.c"]]
    assert graph["planted.d"] == set()  # a type-only import is not a circle
