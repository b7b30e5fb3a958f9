"""Run a rendered pod's command on this machine, as one "node" of the JobSet.

    rendered = render_segment(launch, target)
    node = pod_process(rendered, node_rank=1, root=tmp, hosts={rendered.leader_host: "127.0.0.1"})
    subprocess.Popen(node.argv, env=node.env)

Does what the kubelet and cluster DNS would: resolves the container's env (the node rank
from the Indexed Job's completion index), expands `$(VAR)` references in the command,
materializes the volumes (ConfigMap files, emptyDirs per node, a hostPath as a directory of
the node's that outlives its pods, a PersistentVolumeClaim as one directory all nodes
share) under `root` and points the mount paths there, and
resolves the leader's hostname through `hosts`. Nothing else about the
command changes, so running two of these exercises the exact pod command's rendezvous.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from fm_pipeline.launch.jobset import RenderedSegment
from fm_pipeline.rundir.torchrun import torchrun_executable

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


@dataclass(frozen=True)
class PodProcess:
    node_rank: int
    argv: list[str]
    env: dict[str, str]  # the pod's environment over this process's (PATH, venv, ...)
    mounts: dict[str, Path]  # mountPath in the pod -> directory standing in for it
    termination_log: Path  # the kubelet's terminationMessagePath file, empty at start


def expand_k8s_vars(text: str, env: dict[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined variables are replaced, `$$` is a literal `$`,
    undefined references stay as written."""

    def sub(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(sub, text)


def pod_process(
    rendered: RenderedSegment,
    *,
    node_rank: int,
    root: Path,
    hosts: dict[str, str] | None = None,
    env_overrides: dict[str, str] | None = None,
) -> PodProcess:
    job_spec = rendered.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    if not 0 <= node_rank < job_spec["completions"]:
        raise ValueError(f"node_rank {node_rank} outside 0..{job_spec['completions'] - 1}")
    pod = job_spec["template"]["spec"]
    (container,) = pod["containers"]
    node_root = root / f"node-{node_rank}"
    mounts = _materialize_volumes(pod, container, rendered, node_root)
    termination_log = node_root / "termination-log"
    termination_log.write_text("")
    mounts[container.get("terminationMessagePath", "/dev/termination-log")] = termination_log

    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = expand_k8s_vars(item["value"], env)
        elif (item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
              == COMPLETION_INDEX_FIELD):
            env[item["name"]] = str(node_rank)
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[item["name"]] = f"node-{node_rank}"  # the node this pod stands on
        else:
            raise ValueError(f"env {item['name']}: only values and the completion index are "
                             f"emulated locally, got {item.get('valueFrom')}")
    for name, address in (hosts or {}).items():
        env = {k: v.replace(name, address) for k, v in env.items()}
    env.update(env_overrides or {})
    env = {k: _remap(v, mounts) for k, v in env.items()}

    argv = [_remap(expand_k8s_vars(arg, env), mounts) for arg in container["command"]]
    if argv[0] == "torchrun":
        argv = torchrun_executable() + argv[1:]
    return PodProcess(node_rank=node_rank, argv=argv, env={**os.environ, **env}, mounts=mounts,
                      termination_log=termination_log)


def _materialize_volumes(pod: dict, container: dict, rendered: RenderedSegment,
                         node_root: Path) -> dict[str, Path]:
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if mount["mountPath"] == "/dev/shm":
            continue  # this machine's shared memory is the real thing
        local = node_root / mount["name"]
        if "hostPath" in volume:
            local = host_path_dir(node_root, volume["hostPath"]["path"])
        elif "persistentVolumeClaim" in volume:
            # One directory per claim, seen by every node: a ReadWriteMany volume.
            local = node_root.parent / f"pvc-{volume['persistentVolumeClaim']['claimName']}"
        local.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            if volume["configMap"]["name"] != rendered.config_map["metadata"]["name"]:
                raise ValueError(f"volume {mount['name']}: unknown ConfigMap "
                                 f"{volume['configMap']['name']!r}")
            for key, text in rendered.config_map["data"].items():
                (local / key).write_text(text, encoding="utf-8")
        elif not {"emptyDir", "persistentVolumeClaim", "hostPath"} & set(volume):
            raise ValueError(f"volume {mount['name']}: only configMap, emptyDir, hostPath "
                             "and persistentVolumeClaim are emulated")
        mounts[mount["mountPath"]] = local
    link_nested_mounts(mounts)
    return mounts


def link_nested_mounts(mounts: dict[str, Path]) -> None:
    """A volume mounted inside another (/var/lib/fm/runs in /var/lib/fm) must be what a
    process finds under the outer one's path too: link it there."""
    for inner, local in mounts.items():
        outer = max((m for m in mounts if inner.startswith(m + "/")), key=len, default=None)
        if outer is not None:
            link = mounts[outer] / inner[len(outer) + 1:]
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink() and not link.exists():
                link.symlink_to(local, target_is_directory=True)


def host_path_dir(node_root: Path, path: str) -> Path:
    """The directory standing in for the node's `path`: the node's, whichever pod runs."""
    return node_root / "host" / path.lstrip("/")


def _remap(value: str, mounts: dict[str, Path]) -> str:
    # Longest mount path first: /var/lib/fm/runs is its own volume inside /var/lib/fm.
    for mount_path, local in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        if value == mount_path or value.startswith(mount_path + "/"):
            return str(local) + value[len(mount_path):]
    return value
