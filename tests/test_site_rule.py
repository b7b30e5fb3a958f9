"""Where state lives is decided at the entry points (config.site), and where a worker runs
by its entry point (config.worker_env): below them no module reads those variables from
the environment or builds a Site or a WorkerEnv from it; each is handed the Site, the
WorkerEnv (or the directory it needs). Shown failing on planted violations."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO
from tests.test_layers import SOURCES

# The variables that say where a site's state is (config.site.SITE_ENV, and MLflow's own)
# and where a worker's paths are (config.worker_env); FM_K8S_SCHEMAS is gone for good.
SITE_VARIABLES = {"FM_HOME", "FM_STORE_URI", "FM_MLFLOW_URI", "DAGSTER_HOME",
                  "MLFLOW_TRACKING_URI", "FM_S3_ENDPOINT_URL", "FM_PREEMPT_FILE",
                  "FM_FAST_TIER_DIR", "FM_RACK", "FM_RACK_LABEL", "FM_NODE_NAME",
                  "FM_TERMINATION_LOG", "FM_K8S_SCHEMAS"}
READERS = ("Site", "WorkerEnv")
# Entry points: the `fm` CLI, the Dagster resources and definitions, the torchrun worker,
# and any module's `main()` (the eval and drill workers, ...). config/site.py and
# config/worker_env.py are the readers.
ENTRY_PACKAGES = {"cli", "resources"}
ENTRY_MODULES = {"definitions.py", "train/__main__.py", "config/site.py",
                 "config/worker_env.py"}


def _constants(files: list[Path]) -> dict[str, set[str]]:
    """NAME -> the strings module-level assignments give it anywhere in the sources."""
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                pairs = []
                if isinstance(target, ast.Name):
                    pairs = [(target, node.value)]
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts))
                for name, value in pairs:
                    if isinstance(name, ast.Name) and isinstance(value, ast.Constant) \
                            and isinstance(value.value, str):
                        found.setdefault(name.id, set()).add(value.value)
    return found


def _keys(node, constants) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    name = node.id if isinstance(node, ast.Name) else (
        node.attr if isinstance(node, ast.Attribute) else None)
    return constants.get(name, set())


def _is_environ(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _read_keys(node) -> list:
    """The key expressions an environment read uses: os.environ.get(K) / [K] /
    .setdefault(K) / .pop(K), os.getenv(K), K in os.environ."""
    if isinstance(node, ast.Call) and node.args:
        f = node.func
        if isinstance(f, ast.Attribute) and _is_environ(f.value) and f.attr in (
                "get", "setdefault", "pop"):
            return [node.args[0]]
        if isinstance(f, ast.Attribute) and f.attr == "getenv" and \
                isinstance(f.value, ast.Name) and f.value.id == "os":
            return [node.args[0]]
    if isinstance(node, ast.Subscript) and _is_environ(node.value) and \
            isinstance(node.ctx, ast.Load):
        return [node.slice]
    if isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
        return [node.left]
    return []


def _mains(tree) -> set[int]:
    """ids of the nodes inside a function called main (an entry point of its own)."""
    return {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "main"
            for n in ast.walk(f)}


def site_reads(root: Path, dotted: str, constants, entry_packages=ENTRY_PACKAGES,
               entry_modules=ENTRY_MODULES) -> list[str]:
    """'file:line: what' for every read of a site variable and every Site.from_environ()
    in a module of `root` below the entry points."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        package = dotted.rsplit(".", 1)[-1] if dotted.startswith("fm_pipeline.") else rel.parts[0]
        if package in entry_packages or rel.as_posix() in entry_modules:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_main = _mains(tree)
        for node in ast.walk(tree):
            if id(node) in in_main:
                continue
            for key in _read_keys(node):
                if hit := sorted(_keys(key, constants) & SITE_VARIABLES):
                    found.append(f"{dotted}/{rel}:{node.lineno}: reads {', '.join(hit)}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "from_environ" and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id in READERS:
                found.append(f"{dotted}/{rel}:{node.lineno}: builds a {node.func.value.id} "
                             "from the environment")
    return found


def test_no_module_below_the_entry_points_reads_where_state_lives():
    files = [p for root, _ in SOURCES for p in (REPO / root).rglob("*.py")]
    constants = _constants(files)
    assert constants["ENV_URI"] == {"FM_MLFLOW_URI"}  # names are resolved, not only literals
    from fm_pipeline.config import worker_env
    from fm_pipeline.config.site import SITE_ENV

    named = set(SITE_ENV) | {v for k, v in vars(worker_env).items() if k.endswith("_ENV")}
    assert named <= SITE_VARIABLES, named - SITE_VARIABLES  # a new one is checked too
    found = [line for root, dotted in SOURCES
             for line in site_reads(REPO / root, dotted, constants)]
    assert not found, "\n".join(found)


def test_planted_reads_are_found_and_an_entry_points_main_is_not(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "paths.py").write_text(
        "import os\nHOME = 'FM_HOME'\n"
        "def root():\n    return os.environ.get(HOME, '.fm')\n"
        "def store():\n    return os.environ['FM_STORE_URI']\n"
        "def flag():\n    return os.getenv('FM_PREEMPT_FILE')\n"
        "def tracked():\n    return 'MLFLOW_TRACKING_URI' in os.environ\n")
    (tmp_path / "ckpt" / "late.py").write_text(
        "def where():\n    from fm_pipeline.config.site import Site\n"
        "    return Site.from_environ()\n"
        "def node():\n    return WorkerEnv.from_environ()\n"
        "def main():\n    from fm_pipeline.config.site import Site\n"
        "    return Site.from_environ()\n")
    (tmp_path / "ckpt" / "fine.py").write_text(
        "import os\ndef threads():\n    return os.environ.get('OMP_NUM_THREADS')\n"
        "def child(site):\n    return {**os.environ, **site.env()}\n")
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "main.py").write_text("import os\nHOME = os.environ.get('FM_HOME')\n")
    constants = _constants(list(tmp_path.rglob("*.py")))
    assert site_reads(tmp_path, "planted", constants) == [
        "planted/ckpt/late.py:3: builds a Site from the environment",
        "planted/ckpt/late.py:5: builds a WorkerEnv from the environment",
        "planted/ckpt/paths.py:4: reads FM_HOME",
        "planted/ckpt/paths.py:6: reads FM_STORE_URI",
        "planted/ckpt/paths.py:8: reads FM_PREEMPT_FILE",
        "planted/ckpt/paths.py:10: reads MLFLOW_TRACKING_URI",
    ]
