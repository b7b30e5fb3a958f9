"""Resilience: faults injected into real runs, and multi-node runs in network namespaces.

    fm chaos run                          # the fault matrix -> docs/fault-matrix.md
    fm chaos run --faults kill-rank,hang-rank

Modules: processes (a live local segment, its workers, signals), injectors
(checkpoint/data/disk/S3 faults), netns (network namespaces joined by veth pairs), multinode
(the pod command as nodes), workspace, recovery, scenarios + matrix (the fault matrix),
docs/resilience.md. Stragglers are fm_pipeline.stragglers; the job's event log is
fm_pipeline.rundir.events.
"""
