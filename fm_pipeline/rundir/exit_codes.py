"""Trainer exit codes (the cross-area contract in the team brief); launchers classify by them.

torchrun itself exits 1 for any worker failure; the launcher recovers these codes from the
workers' error files (see fm_pipeline.rundir.exit_record and fm_pipeline.launch.outcome).
"""

SUCCESS = 0
FAILURE = 1
BAD_CONFIG = 2  # also a permanent failure found while training (a corrupt shard, EROFS)
LEASE_HELD = 3  # another live segment of the job holds its lease: this one did nothing
PREEMPTED = 75  # EX_TEMPFAIL: checkpointed on purpose; resume from the latest checkpoint
