"""`fm api serve` on 127.0.0.1: a real server process answers with the published OpenAPI,
and neither its access log nor its own log ever shows a token; it keeps a dagster-daemon
for its instance and stops it when it stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from tests.conftest import REPO, free_port
from tests import local_site


@pytest.mark.server
def test_serve_answers_and_keeps_tokens_out_of_its_logs(fm_home, mix_store):
    research = local_site.token_store().issue(tenant="research")[1]
    admin = local_site.token_store().issue(tenant=None)[1]
    port = free_port()
    env = {**os.environ, "FM_HOME": str(fm_home), "FM_STORE_URI": mix_store["root"]}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fm_pipeline.cli.api", "serve", "--port", str(port)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
        spec = httpx.get(f"{base}/openapi.json").json()
        assert "/v1/training/jobs/{job_id}/resume" in spec["paths"]
        h = {"Authorization": f"Bearer {research}"}
        assert httpx.get(f"{base}/v1/training/jobs", headers=h).json() == {"jobs": []}
        r = httpx.post(f"{base}/v1/training/jobs", headers=h, json={
            "model": "debug", "gpus": 2, "data_manifest": "data/0123456789abcdef/manifest.json"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "data_manifest"]
        # A token pasted into a URL lands in the access log's request line: it is masked.
        assert httpx.get(f"{base}/v1/training/jobs/{admin}", headers=h).status_code == 422
        assert httpx.get(f"{base}/v1/training/jobs?tenant={research}",
                         headers={"Authorization": f"Bearer {admin}"}).status_code == 422
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0].decode()
    # uvicorn shuts down cleanly, then re-raises the SIGTERM it caught: fm exits 128+15
    # after its `finally` blocks stopped the daemon it kept (its lock is free again)
    assert proc.returncode == 128 + signal.SIGTERM and "Finished server process" in out, out
    from fm_pipeline.deploy.exclusive import held

    assert not held(fm_home / "dagster" / "daemon.lock")
    assert "dagster-daemon" in out
    assert "Logging error" not in out
    assert f"http://127.0.0.1:{port}" in out and '"GET /v1/training/jobs HTTP/1.1" 200' in out
    flat = " ".join(out.split())  # rich wraps the banner at the console width
    assert "dagster orchestrator" in flat  # the default
    assert "[redacted]" in out
    unwrapped = out.replace("\n", "")  # a token split by a line wrap would still leak
    assert research not in unwrapped and admin not in unwrapped
