"""The trainer: one torchrun segment of a job, between checkpoints.

    torchrun --standalone --nproc-per-node 2 -m fm_pipeline.train --job configs/demo.yaml

`__main__` (CLI, exit codes) -> `segment.run_segment` (restore, loop, checkpoints,
preemption, reporting) -> `trainer.Trainer` (one rank's model, optimizers, data, step).
Metrics files are documented in `metrics`; the model and its parallelism come from
`fm_pipeline.model` and `fm_pipeline.parallel`. See docs/trainer.md.
"""
