"""Checkpoints inside the ranks, on torch.distributed.checkpoint: async sharded saves committed
by a manifest, resharding restores, restore drills and export. What a checkpoint is and
where it lives (paths, manifest, validation, retention, tiering) is fm_pipeline.catalog.

In the trainer (every rank):

    app_state = {"model": ModelState(parts), "optimizer": OptimizerState(parts, optims),
                 "lr_scheduler": LRSchedulerState(scheds), "dataloader": loader,
                 "train_state": train_state}
    manager = CheckpointManager(job, app_state, site=site, mesh=mesh, mix_key=key)
    restored = manager.restore_latest()                  # None on a fresh start
    manager.save(step, tokens_seen=n, probe=Probe(batch, loss), final=is_last)
    manager.close()

Around training (one process): `run_restore_drill`, `drill_latest`, `export_torch_save`.
Names resolve lazily, so the control side may import `fm_pipeline.checkpoint.drill`
without torch. See docs/checkpoints.md.
"""

from __future__ import annotations

from fm_pipeline.lazy import lazy_exports

_EXPORTS = {
    "Probe": "commit",
    "DrillResult": "drill", "drill_latest": "drill", "run_restore_drill": "drill",
    "export_torch_save": "export", "load_full_state": "export",
    "CheckpointManager": "manager", "CheckpointSaveError": "manager", "SaveResult": "manager",
    "NoRestorableCheckpoint": "load", "RestoreResult": "load", "restore": "load",
    "restore_latest": "load",
    "LRSchedulerState": "state", "ModelState": "state", "OptimizerState": "state",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
