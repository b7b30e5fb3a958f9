"""The planner: parallelism, memory, MFU, checkpoint interval, time-to-train and $/token.

    from fm_pipeline.planner.cluster import make_cluster
    from fm_pipeline.planner.estimate import estimate
    from fm_pipeline.planner.layout import Layout
    from fm_pipeline.planner.shape import named_shape
    est = estimate(named_shape("llama3-405b", seq_len=8192), make_cluster("h100"),
                   Layout(tp=8, pp=16, dp=128, virtual_stages=4, recompute="half"),
                   global_batch_tokens=16 * 2**20)
    est.to_dict()["mfu"]

Also: search.search, whatif.what_if, job.plan_for_job, compare.compare_with_measured.
The package itself imports nothing heavy. The accelerator catalog it shares with the
trainer's MFU is fm_pipeline.accelerators. See docs/planner.md; `fm plan --help`.
"""
