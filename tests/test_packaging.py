"""The product as others install it: the control side without torch, and a wheel.

- With torch unimportable (an API or daemon image carries none), the API app and the Dagster
  definitions import, and `fm ckpt list`, `fm plan estimate`, `fm simulate job` and
  `fm k8s render` work.
- A wheel built from the tree, installed without dependencies into a fresh venv that sees the
  project's installed ones, runs `fm k8s render` and `fm plan estimate --job` on the packaged
  demo spec from an unrelated directory: everything read at run time is package data.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

BLOCK_TORCH = textwrap.dedent("""
    import sys

    class NoTorch:  # as if torch were not installed at all
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}")

    sys.meta_path.insert(0, NoTorch())
""")


def _run(code: str, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_control_side_runs_without_torch(tmp_path, fm_home):
    code = BLOCK_TORCH + textwrap.dedent(f"""
        import fm_pipeline.api.app, fm_pipeline.definitions
        from fm_pipeline.cli.main import app
        from fm_pipeline.defaults import DEMO_JOB
        for args in (["ckpt", "list"], ["plan", "estimate", "--job", str(DEMO_JOB), "--json"],
                     ["simulate", "job"],
                     ["k8s", "render", "--out", {str(tmp_path / "k8s")!r},
                      "--store-uri", "s3://bucket/fm"]):
            try:
                app(args, standalone_mode=False)
            except SystemExit as e:
                assert not e.code, (args, e.code)
            print("ran", args[0], args[1], flush=True)
        assert "torch" not in sys.modules
    """)
    out = _run(code, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert [line.split()[1] for line in out.stdout.splitlines() if line.startswith("ran ")] == [
        "ckpt", "plan", "simulate", "k8s"]
    assert sorted(p.name for p in (tmp_path / "k8s").iterdir()) == [
        "configmap-demo-20-job.yaml", "jobset-demo-20.yaml"]
    assert '"mfu"' in out.stdout  # the estimate's JSON


@pytest.mark.slow
def test_a_wheel_installed_elsewhere_carries_what_it_reads(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".fm", ".git", "__pycache__", "build", "*.egg-info", "tests", "docs"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path / "dist"), "-q"],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("fm_pipeline-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = subprocess.run([venv / "bin/python", "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # The project's dependencies, as installed here (a plain path: its .pth files, the
    # editable checkout among them, are not run).
    (venv / site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([venv / "bin/python", "-m", "pip", "install", "--no-deps", "-q",
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FM_", "PYTHON"))}
    env["FM_HOME"] = str(tmp_path / "home")
    where = subprocess.run([venv / "bin/python", "-c", "import fm_pipeline.defaults as d; "
                            "print(d.__file__); print(d.DEMO_JOB)"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, check=True).stdout.split()
    assert where[0].startswith(str(venv)), where
    demo = where[1]
    render = subprocess.run([venv / "bin/fm", "k8s", "render", "--job", demo, "--out", "k8s",
                             "--store-uri", "s3://bucket/fm"], cwd=elsewhere, env=env,
                            capture_output=True, text=True, timeout=300)
    assert render.returncode == 0, render.stdout[-2000:] + render.stderr[-2000:]
    assert (elsewhere / "k8s" / "jobset-demo-20.yaml").is_file()
    plan = subprocess.run([venv / "bin/fm", "plan", "estimate", "--job", demo, "--json"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert '"memory_gib_per_gpu"' in plan.stdout

    # What the image's manifests run is in the wheel: the rendered JobSet's and the fast
    # tier keeper's modules import from the installed package, `fm` is its script, and
    # the dev cluster's Go module (what `fm dev cluster build` compiles) is package data.
    import yaml

    jobset = yaml.safe_load((elsewhere / "k8s" / "jobset-demo-20.yaml").read_text())
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    commands = [c["command"] for c in pod["containers"]]
    commands += [c["lifecycle"]["preStop"]["exec"]["command"] for c in pod["containers"]]
    keeper = subprocess.run([venv / "bin/python", "-c", textwrap.dedent("""
        import json
        from fm_pipeline.launch.keeper import keeper_daemonset
        from fm_pipeline.launch.pod import Placement
        ds = keeper_daemonset(namespace="ns", image="fm-pipeline:latest",
                              host_path="/dev/shm/fm", placement=Placement())
        print(json.dumps([c["command"] for c in ds["spec"]["template"]["spec"]["containers"]]))
    """)], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert keeper.returncode == 0, keeper.stderr[-2000:]
    commands += json.loads(keeper.stdout)
    modules = {argv[argv.index("-m") + 1] for argv in commands if "-m" in argv}
    assert modules == {"fm_pipeline.train", "fm_pipeline.checkpoint.fast_keeper"}, commands
    assert {argv[0] for argv in commands} == {"torchrun", "python", "/bin/sh"}, commands
    for module in sorted(modules):
        origin = subprocess.run([venv / "bin/python", "-c", "import importlib.util, sys; "
                                 f"print(importlib.util.find_spec({module!r}).origin)"],
                                cwd=elsewhere, env=env, capture_output=True, text=True,
                                check=True).stdout.strip()
        assert origin.startswith(str(venv)), (module, origin)
    assert (venv / "bin" / "fm").is_file()
    gomod = subprocess.run([venv / "bin/python", "-c", "from fm_pipeline.devcluster.build "
                            "import gomod_dir; print(gomod_dir())"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert gomod.startswith(str(venv)) and "k8s.io/kubernetes v1.36.3" in (
        Path(gomod) / "go.mod").read_text()
    # The Dockerfile builds its wheel from what this test built it from.
    dockerfile = (REPO / "Dockerfile").read_text()
    copied = {word for line in dockerfile.splitlines() if line.startswith("COPY ")
              and "--from" not in line for word in line.split()[1:-1]}
    assert {"pyproject.toml", "setup.py", "fm_pipeline", "assets", "resources"} <= copied
    assert "torch==2.13.0" in dockerfile and "-c /dist/constraints.txt" in dockerfile
