"""Checkpoints on torch.distributed.checkpoint: async sharded saves committed by a manifest,
object-store tiering, validation, resharding restore, retention and restore drills.

In the trainer (every rank):

    app_state = {"model": ModelState(parts), "optimizer": OptimizerState(parts, optims),
                 "lr_scheduler": LRSchedulerState(scheds), "dataloader": loader,
                 "train_state": train_state}
    manager = CheckpointManager(job, app_state, mesh=mesh, mix_key=key)
    restored = manager.restore_latest()                  # None on a fresh start
    manager.save(step, tokens_seen=n, probe=Probe(batch, loss), final=is_last)
    manager.close()

Around training (one process): `latest_valid`, `validate`, `apply_retention`,
`sync_to_store`, `export_torch_save`, `run_restore_drill`. See docs/checkpoints.md.
"""

from fm_pipeline.checkpoint.commit import Probe
from fm_pipeline.checkpoint.drill import DrillResult, drill_latest, run_restore_drill
from fm_pipeline.checkpoint.export import export_torch_save, load_full_state
from fm_pipeline.checkpoint.layout import CheckpointRef, list_local, list_store, local_root, store_root
from fm_pipeline.checkpoint.manager import CheckpointManager, CheckpointSaveError, SaveResult
from fm_pipeline.checkpoint.manifest import Manifest, ManifestError
from fm_pipeline.checkpoint.marks import read_marks, write_mark
from fm_pipeline.checkpoint.restore import (
    NoRestorableCheckpoint,
    RestoreResult,
    restore,
    restore_latest,
)
from fm_pipeline.checkpoint.retention import RetentionReport, apply_retention
from fm_pipeline.checkpoint.state import LRSchedulerState, ModelState, OptimizerState
from fm_pipeline.checkpoint.tiering import (
    UploadReport,
    download_checkpoint,
    sync_to_store,
    upload_checkpoint,
)
from fm_pipeline.checkpoint.validate import (
    CheckpointInvalid,
    Discovery,
    Problem,
    latest_valid,
    read_manifest,
    validate,
)

__all__ = [
    "CheckpointInvalid", "CheckpointManager", "CheckpointRef", "CheckpointSaveError",
    "Discovery", "DrillResult", "drill_latest", "run_restore_drill", "LRSchedulerState", "Manifest", "ManifestError", "ModelState",
    "NoRestorableCheckpoint",
    "OptimizerState", "Probe", "Problem", "RestoreResult", "RetentionReport", "SaveResult",
    "UploadReport", "apply_retention", "download_checkpoint", "export_torch_save",
    "latest_valid", "list_local", "list_store", "load_full_state", "local_root",
    "read_manifest", "read_marks", "restore", "restore_latest", "store_root", "sync_to_store",
    "upload_checkpoint", "validate", "write_mark",
]
