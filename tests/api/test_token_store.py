"""The token store under concurrent writers (the CLI and the server are separate processes):
2 processes x 50 issue/revoke operations on one store. Every revoked token is refused, every
kept one accepted, by a long-lived reader too (a server's store); the file parses at every
moment. A damaged file and a token of a tenant the server does not know get clear answers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from fm_pipeline.api.auth import tokens_path
from tests import local_site
from tests.conftest import REPO

WORKER = r"""
import json, os, sys, time
from tests import local_site
store, kept, revoked = local_site.token_store(), [], []
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):  # both start together: their operations interleave
    time.sleep(0.001)
for i in range(50):
    token_id, token = store.issue(tenant="research")
    if i % 2:  # revoke every other one at once: issue and revoke interleave across processes
        assert store.revoke(token_id), token_id
        revoked.append(token)
    else:
        kept.append(token)
print(json.dumps({"kept": kept, "revoked": revoked}))
"""


def test_two_processes_issuing_and_revoking_lose_nothing(fm_home):
    server_view = local_site.token_store()  # long-lived, like the API server's
    path = tokens_path(local_site.site())
    seen_bad, stop = [], threading.Event()

    def watch():  # the file, read as any process would, parses at every moment
        while not stop.is_set():
            try:
                json.loads(path.read_text())
            except FileNotFoundError:
                pass
            except ValueError as e:
                seen_bad.append(str(e))

    watcher = threading.Thread(target=watch)
    watcher.start()
    go = fm_home / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(go)], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    stop.set()
    watcher.join()
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    results = [json.loads(out) for out, _ in outs]
    kept = [t for r in results for t in r["kept"]]
    revoked = [t for r in results for t in r["revoked"]]
    assert len(kept) == len(revoked) == 50
    assert not seen_bad
    for token in revoked:
        assert server_view.verify(token) is None
        assert local_site.token_store().verify(token) is None
    for token in kept:
        assert server_view.verify(token).tenant == "research"
    assert len(json.loads(path.read_text())["tokens"]) == 50
    assert (path.stat().st_mode & 0o777) == 0o600


def test_a_damaged_store_answers_503_and_an_unknown_tenant_403(client, tokens):
    """`client` serves the tenants research and prod; a token of tenant 'ghost' (issued by
    the CLI against another tenants file) is refused by name, not a 500."""
    ghost = local_site.token_store().issue(tenant="ghost")[1]
    r = client.get("/v1/training/jobs", headers={"Authorization": f"Bearer {ghost}"})
    assert r.status_code == 403, r.text
    assert "tenant 'ghost'" in r.json()["detail"] and "research" in r.json()["detail"]

    tokens_path(local_site.site()).write_text('{"tokens": [{"id": "tok-1"')  # truncated by hand
    r = client.get("/v1/training/jobs",
                   headers={"Authorization": f"Bearer {tokens['research']}"})
    assert r.status_code == 503, r.text
    assert "tokens.json cannot be read" in r.json()["detail"]
