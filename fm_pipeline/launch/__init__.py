"""Launching training segments: the torchrun invocation, locally and as a Kubernetes JobSet.

    from fm_pipeline.launch import SegmentLaunch, run_segment_locally, render_segment
    result = run_segment_locally(SegmentLaunch(job, end_step=20), site=site)  # SegmentResult
    rendered = render_segment(SegmentLaunch(job, end_step=20),
                              KubernetesTarget(store_uri="s3://bucket/fm"))

Modules: spec (the invocation), local (run it here), outcome (real exit code and reason,
read from what fm_pipeline.rundir.exit_record leaves), pod + jobset (Kubernetes objects),
k8s_validate (strict validation), k8s_client (submit/follow/stop/delete), k8s_follow
(failure causes and the result), k8s_stop (stopping a followed JobSet from any process),
pod_local (run a rendered pod's command as a local "node"). Exports resolve lazily.
"""

from __future__ import annotations

from fm_pipeline.lazy import lazy_exports

_EXPORTS = {
    "SegmentLaunch": "spec", "Standalone": "spec", "PetRendezvous": "spec",
    "run_segment_locally": "local",
    "Outcome": "outcome", "SegmentResult": "outcome", "SegmentFailed": "outcome",
    "SegmentPreempted": "outcome",
    "Placement": "pod",
    "KubernetesTarget": "jobset", "RenderedSegment": "jobset", "render_segment": "jobset",
    "ManifestInvalid": "k8s_validate", "validate_object": "k8s_validate",
    "JobSetClient": "k8s_client", "segment_result": "k8s_follow",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
