"""What a launcher tells one worker process about the place it runs, beside the Site: the
preemption flag to watch, the node's fast-tier directory and failure domain, the pod's
termination log. Set by the launchers (launch/local.py, launch/pod.py, the multi-node
harness), parsed once by the worker's entry point (`WorkerEnv.from_environ()` in
train/__main__.py) and passed down; nothing below it reads these variables.

torch's own contract (RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, MASTER_*, TORCHELASTIC_*)
is read where torch's API is used, as torch itself reads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# The trainer polls this file at step boundaries; a Kubernetes preStop hook touches it, so
# ranks checkpoint before SIGTERM arrives.
PREEMPT_FILE_ENV = "FM_PREEMPT_FILE"
FAST_DIR_ENV = "FM_FAST_TIER_DIR"  # the node's fast-tier snapshots (default: /dev/shm)
RACK_ENV = "FM_RACK"  # the node's failure domain, when the launcher knows it
# On Kubernetes (launch/pod.py): the node label that names a failure domain, and the pod's
# node (downward API); the label is read from the API, which the downward API does not give.
RACK_LABEL_ENV = "FM_RACK_LABEL"
NODE_NAME_ENV = "FM_NODE_NAME"
TERMINATION_LOG_ENV = "FM_TERMINATION_LOG"  # the container's terminationMessagePath


@dataclass(frozen=True)
class WorkerEnv:
    preempt_file: Path | None = None
    fast_dir: Path | None = None
    rack: str | None = None
    rack_label: str | None = None
    node_name: str | None = None
    termination_log: Path | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """The one reader of these variables: the worker's entry point only."""
        env = os.environ if environ is None else environ

        def path(name: str) -> Path | None:
            return Path(env[name]) if env.get(name) else None

        return cls(preempt_file=path(PREEMPT_FILE_ENV), fast_dir=path(FAST_DIR_ENV),
                   rack=env.get(RACK_ENV) or None, rack_label=env.get(RACK_LABEL_ENV) or None,
                   node_name=env.get(NODE_NAME_ENV) or None,
                   termination_log=path(TERMINATION_LOG_ENV))
