"""Build the dev cluster's components from Go modules, once per set of versions.

    built = build_components(cache_root)      # ~/.cache/fm-pipeline/kube/<key>/
    built.binary("kube-apiserver")            # .../bin/kube-apiserver
    built.crds("jobset")                      # the CRD files of the JobSet module that was built

`gomod/go.mod` pins k8s.io/kubernetes (its `k8s.io/*` staging modules replaced by their
`v0.x` releases, as projects that import Kubernetes do), etcd's server, JobSet and Kueue,
and names their commands as `tool`s; one `go build` compiles them all, sharing the compile
of common packages. The key is the go.mod, go.sum, Go version and link flags: a rebuild
with the same key is a directory lookup, and Go's own build cache makes a rebuild after a
change cheap. The CRDs, webhook configurations and RBAC roles the cluster installs are
copied from the same modules' source, so the cluster runs exactly what was compiled.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

KUBERNETES_VERSION = "v1.36.3"
# The binaries report this version (the apiserver's /version, feature-gate emulation);
# an unstamped build says v0.0.0-master.
_VERSION_PKG = "k8s.io/component-base/version"
LDFLAGS = (f"-s -w -X {_VERSION_PKG}.gitVersion={KUBERNETES_VERSION} "
           f"-X {_VERSION_PKG}.gitMajor=1 -X {_VERSION_PKG}.gitMinor=36 "
           f"-X {_VERSION_PKG}.gitTreeState=clean")
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "jobset",
            "kueue")
# Module -> what the cluster installs from its source tree.
MANIFESTS = {
    "sigs.k8s.io/jobset": ("config/components/crd/bases", "config/components/webhook",
                           "config/components/rbac"),
    "sigs.k8s.io/kueue": ("config/components/crd/bases", "config/components/webhook",
                          "config/components/rbac"),
}
_COMPLETE = ".complete"


class BuildFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Components:
    root: Path

    def binary(self, name: str) -> Path:
        return self.root / "bin" / name

    def source(self, module: str) -> Path:
        """The copied source folders (crd/bases, webhook, rbac) of a module, by its short
        name: "jobset" or "kueue"."""
        return self.root / "src" / module

    def crds(self, module: str) -> list[Path]:
        return sorted((self.source(module) / "crd" / "bases").glob("*.yaml"))

    @property
    def versions(self) -> dict[str, str]:
        return json.loads((self.root / "versions.json").read_text())


def default_cache() -> Path:
    return Path.home() / ".cache" / "fm-pipeline" / "kube"


def gomod_dir() -> Path:
    return Path(str(resources.files("fm_pipeline.devcluster") / "gomod"))


def go_executable() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildFailed("the dev cluster is built from Go modules and `go` is not on PATH: "
                          "install Go >= 1.26 (docs/kubernetes.md)")
    return go


def build_key(go: str) -> str:
    version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True,
                             check=True).stdout.strip()
    digest = hashlib.sha256()
    for part in ((gomod_dir() / "go.mod").read_bytes(), (gomod_dir() / "go.sum").read_bytes(),
                 version.encode(), LDFLAGS.encode()):
        digest.update(hashlib.sha256(part).digest())
    return f"{KUBERNETES_VERSION}-{digest.hexdigest()[:12]}"


def built_components(cache_root: Path) -> Components | None:
    """The components already built for these versions, or None."""
    root = cache_root / build_key(go_executable())
    return Components(root) if (root / _COMPLETE).exists() else None


def build_components(cache_root: Path, *, log=print) -> Components:
    """Build (or find) every component; raises BuildFailed with go's own message."""
    go = go_executable()
    root = cache_root / build_key(go)
    if (root / _COMPLETE).exists():
        return Components(root)
    cache_root.mkdir(parents=True, exist_ok=True)
    # Build in a private folder and rename it in: a reader never sees a half-built cache,
    # and two builders at once each finish (the second rename finds the first's).
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=cache_root))
    try:
        shutil.copy(gomod_dir() / "go.mod", work / "go.mod")
        shutil.copy(gomod_dir() / "go.sum", work / "go.sum")
        env = {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false"}
        log(f"building {', '.join(BINARIES)} from Go modules (tens of minutes the first time "
            f"on 2 cores; cached in {root})")
        _go(go, ["build", "-o", str(work / "bin") + "/", "-ldflags", LDFLAGS, "tool"], work, env)
        if sorted(p.name for p in (work / "bin").iterdir()) != sorted(
                ["server" if b == "etcd" else b for b in BINARIES]):
            raise BuildFailed(f"go build made {sorted(os.listdir(work / 'bin'))}, expected "
                              f"{sorted(BINARIES)}")
        # etcd's command package is go.etcd.io/etcd/server/v3: its binary is named `server`.
        (work / "bin" / "server").rename(work / "bin" / "etcd")
        versions = _copy_sources(go, work, env)
        (work / "versions.json").write_text(json.dumps(versions, indent=1, sort_keys=True))
        (work / _COMPLETE).write_text("")
        try:
            work.rename(root)
        except OSError:
            if not (root / _COMPLETE).exists():
                raise
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return Components(root)


def _copy_sources(go: str, work: Path, env: dict) -> dict[str, str]:
    modules = json.loads("[" + _go(go, ["list", "-m", "-json", "k8s.io/kubernetes",
                                        "go.etcd.io/etcd/server/v3", *MANIFESTS], work,
                                   env).replace("}\n{", "},{") + "]")
    versions = {m["Path"]: m["Version"] for m in modules}
    for module in modules:
        if module["Path"] not in MANIFESTS:
            continue
        short = module["Path"].rsplit("/", 1)[1]
        for folder in MANIFESTS[module["Path"]]:
            dest = work / "src" / short / Path(folder).name
            if Path(folder).name == "bases":
                dest = work / "src" / short / "crd" / "bases"
            shutil.copytree(Path(module["Dir"]) / folder, dest)
    return versions


def _go(go: str, args: list[str], cwd: Path, env: dict) -> str:
    done = subprocess.run([go, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildFailed(f"go {' '.join(args[:2])} failed in {cwd}:\n{done.stderr[-4000:]}")
    return done.stdout
