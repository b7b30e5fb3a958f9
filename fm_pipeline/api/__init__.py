"""The REST control plane for training jobs: tenants with quotas, fair share, priorities,
preemption; per-tenant tokens.

    fm api token issue --tenant research
    fm api serve                                   # http://127.0.0.1:8600/docs

Modules: app (FastAPI routes), schemas (bodies), job_mapping (seed body -> JobSpec),
control_plane (queue + policy + orchestrator), orchestrator (the interface),
local_orchestrator (torchrun segments on this machine), progress (status from the job's
checkpoints and metrics), store (the queue's own state), auth (hashed tokens, log
redaction), limits (body size). The policy itself is fm_pipeline.scheduling.
See docs/control-plane.md.
"""
