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
