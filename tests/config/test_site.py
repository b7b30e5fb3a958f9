"""A Site and a WorkerEnv as their entry points build them: what a child process is given
builds the same Site; the site's S3 service reaches every store it opens; the launcher's
variables land in the WorkerEnv's fields (and nothing else is read)."""

from __future__ import annotations

from pathlib import Path

from fm_pipeline.config.site import Site
from fm_pipeline.config.worker_env import WorkerEnv
from fm_pipeline.storage.s3 import S3Store


def test_a_child_given_site_env_builds_the_same_site(tmp_path):
    site = Site.at(tmp_path / "home", store_uri="s3://bucket/fm",
                   tracking_uri="http://127.0.0.1:5000", s3_endpoint="http://127.0.0.1:9000")
    assert Site.from_environ(site.env()) == site
    plain = Site.at(tmp_path / "home")
    assert Site.from_environ(plain.env()) == plain and "FM_S3_ENDPOINT_URL" not in plain.env()


def test_every_store_the_site_opens_is_on_its_s3_service(tmp_path):
    site = Site.from_environ({"FM_HOME": str(tmp_path), "FM_STORE_URI": "s3://bucket/fm",
                              "FM_S3_ENDPOINT_URL": "http://127.0.0.1:9000"})
    store = site.store()
    assert isinstance(store, S3Store) and store.endpoint_url == "http://127.0.0.1:9000"
    other = site.open_store("s3://elsewhere/x")
    assert other.endpoint_url == "http://127.0.0.1:9000"
    local = site.open_store(tmp_path / "store")  # a data source read into it: the same service
    assert local.s3_endpoint == "http://127.0.0.1:9000"
    assert site.with_store("s3://b2/y").s3_endpoint == site.s3_endpoint


def test_the_worker_env_holds_what_the_launcher_set():
    worker = WorkerEnv.from_environ({
        "FM_PREEMPT_FILE": "/var/lib/fm/PREEMPT", "FM_FAST_TIER_DIR": "/var/lib/fm-fast",
        "FM_RACK_LABEL": "topology.kubernetes.io/zone", "FM_NODE_NAME": "gpu-7",
        "FM_TERMINATION_LOG": "/dev/termination-log", "FM_RACK": ""})
    assert worker == WorkerEnv(preempt_file=Path("/var/lib/fm/PREEMPT"),
                               fast_dir=Path("/var/lib/fm-fast"), rack=None,
                               rack_label="topology.kubernetes.io/zone", node_name="gpu-7",
                               termination_log=Path("/dev/termination-log"))
    assert WorkerEnv.from_environ({}) == WorkerEnv()
