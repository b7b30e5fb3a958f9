"""The fault matrix's scenarios, one function per fault: (ChaosWorkspace) -> FaultResult.

    process     kill-rank, hang-rank, preempt, kill-node
    checkpoint  ckpt-flip-byte, ckpt-truncate, ckpt-delete
    storage     s3-down, disk-full
    inputs      bad-config, bad-data

Shared machinery (inject into a live segment, let the policy decide, resume, measure) is in
fm_pipeline.resilience.scenarios.common.
"""
