"""Fail points: named places in the control side where a chaos run makes this process die,
as etcd's gofail and FreeBSD's fail points do, so that a crash lands exactly between two
writes instead of wherever a timer happened to fire.

    FM_FAILPOINTS="api.after_run_submitted=kill"     # in the environment of `fm api serve`
    failpoint("api.after_run_submitted")             # at that place in the code

`kill` is the only action: SIGKILL to this process, so nothing after the point runs, no
handler, no `finally`, no flush (what a machine loss or the OOM killer does). Without the
variable a fail point costs one environment lookup. `fm chaos run` sets it; nobody else
should.
"""

from __future__ import annotations

import os
import signal

ENV = "FM_FAILPOINTS"
ACTIONS = ("kill",)


def armed() -> dict[str, str]:
    """name -> action from FM_FAILPOINTS ("a=kill,b=kill"); a malformed entry is an error
    (a chaos run that silently injects nothing would report a pass it never tested)."""
    spec = os.environ.get(ENV, "").strip()
    points: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        name, sep, action = entry.partition("=")
        if not sep or not name or action not in ACTIONS:
            raise ValueError(f"{ENV}: {entry!r} is not NAME=ACTION with ACTION one of "
                             f"{', '.join(ACTIONS)}")
        points[name] = action
    return points


def failpoint(name: str) -> None:
    if ENV in os.environ and armed().get(name) == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
