"""The checkpoint catalog: what checkpoints a job has, in which tier, whether each is valid,
which to keep, and moving them between tiers. Imports no torch: the API, the Dagster
definitions and `fm ckpt` read checkpoints through it; `fm_pipeline.checkpoint` writes and
loads them inside the ranks.

    refs = list_local(site.checkpoints_dir("demo")) + list_store(store, store_root("demo"))
    problems = validate(ref, job)                 # [] means it can be restored
    found = latest_valid(job, store=store, root=root)  # newest valid, and why newer ones were not
    report = apply_retention("demo", keep_last=3, root=root)  # keep, delete, set aside
    upload_checkpoint(ref, store, job_name="demo")

Modules: refs (paths and CheckpointRef), manifest (the commit record), marks (sidecar JSON),
supersede (rollback ledger), aside (kept out of the namespace with a reason), validate,
verdict (validity kept beside a checkpoint), retention, tiering (local <-> store).
See docs/checkpoints.md.
"""

from fm_pipeline.catalog.manifest import Manifest, ManifestError
from fm_pipeline.catalog.marks import read_marks, write_mark
from fm_pipeline.catalog.refs import CheckpointRef, list_local, list_store, store_root
from fm_pipeline.catalog.retention import RetentionReport, apply_retention
from fm_pipeline.catalog.tiering import (
    UploadReport,
    download_checkpoint,
    sync_to_store,
    upload_checkpoint,
)
from fm_pipeline.catalog.validate import (
    CheckpointInvalid,
    Discovery,
    Problem,
    latest_valid,
    read_manifest,
    validate,
)

__all__ = [
    "CheckpointInvalid", "CheckpointRef", "Discovery", "Manifest", "ManifestError", "Problem",
    "RetentionReport", "UploadReport", "apply_retention", "download_checkpoint", "latest_valid",
    "list_local", "list_store", "read_manifest", "read_marks", "store_root",
    "sync_to_store", "upload_checkpoint", "validate", "write_mark",
]
