"""KubernetesLauncher: training segments as JobSets, with rank 0's Pipes messages from pod logs.

    launcher = KubernetesLauncher(store_uri="s3://bucket/fm", kubeconfig_file="~/.kube/config")
    run = launcher.launch_segment(context, job=job, end_step=20, placement=plan_placement)

Same call and results as LocalLauncher. It opens a Pipes session whose context travels in
the pods' env (PipesEnvContextInjector) and whose messages rank 0 writes to stderr, renders
and submits the segment (fm_pipeline.launch.jobset, k8s_client), and follows it: each
leader pod's log is read by dagster-k8s's PipesK8sPodLogsMessageReader, re-attaching to the
new leader after a JobSet restart. A cancelled run (or a timeout) deletes the JobSet; a
finished one is deleted unless `delete_on_completion` is off.

    launcher.stop_segments("job-1", reason="preempt")     # any process on this machine

stops the job's followed JobSets gracefully (fm_pipeline.launch.k8s_stop): the JobSet is
deleted in the foreground, its pods get the preStop hook (the trainer's preemption flag),
SIGTERM and their grace period, and the launch keeps reading the leader's log until they
are gone: a trainer that checkpointed and exited 75 makes the segment `preempted`.
"""

from __future__ import annotations

from dagster import (
    PipesClientCompletedInvocation,
    PipesEnvContextInjector,
    open_pipes_session,
)
from fm_pipeline.resources.launcher_results import SegmentRun, segment_failure
from fm_pipeline.resources.segment_launcher import SegmentLauncher
from pydantic import Field

from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
from fm_pipeline.launch.k8s_client import JobSetClient
from fm_pipeline.launch.k8s_follow import segment_result
from fm_pipeline.launch.k8s_kueue_events import KueueEventLog
from fm_pipeline.launch.k8s_stop import followed_jobset, followed_jobsets, stop_jobsets
from fm_pipeline.launch.pod import Placement
from fm_pipeline.launch.spec import SegmentLaunch


class KubernetesLauncher(SegmentLauncher):
    """Runs each segment as a JobSet (one Indexed Job, a pod per node), queued by Kueue."""

    store_uri: str = Field(description="object store every pod shares: s3://bucket/prefix")
    kubeconfig_file: str | None = Field(default=None, description="default: ~/.kube/config")
    kube_context: str | None = None
    in_cluster: bool = Field(default=False, description="use the pod's service account")
    namespace: str | None = Field(default=None, description="default: job.cluster.namespace")
    image: str | None = Field(default=None, description="default: job.cluster.image")
    s3_endpoint_url: str | None = None
    shared_volume_claim: str | None = Field(
        default=None, description="ReadWriteMany PVC for the local checkpoint tier (nnodes > 1)")
    credentials_secret: str | None = Field(default=None, description="Secret with AWS_* keys")
    service_account: str | None = None
    max_restarts: int = Field(default=3, ge=0, description="JobSet restarts beyond node loss")
    poll_interval_s: float = Field(default=5.0, gt=0)
    delete_on_completion: bool = True

    def jobset_client(self) -> JobSetClient:
        if self.in_cluster:
            return JobSetClient.in_cluster()
        return JobSetClient.from_kubeconfig(self.kubeconfig_file, self.kube_context)

    def run_launch(self, context, launch: SegmentLaunch, *, extras: dict, placement: Placement,
                   env: dict) -> SegmentRun:
        job, end_step = launch.job, launch.end_step
        client = self.jobset_client()
        # Here, not at import: dagster-k8s brings the kubernetes client (0.7 s), and every
        # run worker loads this module with the definitions, local launches included.
        from dagster_k8s.pipes import PipesK8sPodLogsMessageReader

        reader = PipesK8sPodLogsMessageReader()
        with open_pipes_session(context=context, context_injector=PipesEnvContextInjector(),
                                message_reader=reader, extras=extras) as session:
            rendered = render_segment(launch, KubernetesTarget(
                store_uri=self.store_uri, s3_endpoint_url=self.s3_endpoint_url,
                shared_volume_claim=self.shared_volume_claim,
                credentials_secret=self.credentials_secret, image=self.image,
                namespace=self.namespace, max_restarts=self.max_restarts,
                service_account=self.service_account, placement=placement,
                extra_env={**env, **session.get_bootstrap_env_vars()},
            ))
            name, ns = rendered.name, rendered.namespace
            client.submit(rendered)
            context.log.info(f"submitted JobSet {ns}/{name} ({job.parallelism.nnodes} nodes)")

            def read_leader(pod: str) -> None:
                context.log.info(f"reading rank 0 from pod {pod}")
                reader.consume_pod_logs(context=context, core_api=client.core, pod_name=pod,
                                        namespace=ns)

            try:
                runs = self.site().runs_dir(job.name)
                with followed_jobset(runs, rendered) as record:
                    kueue = KueueEventLog(runs, name, eviction=lambda: client.eviction(name, ns))
                    followed = self._follow(context, client, name, ns, read_leader, kueue)
                    stopped = record.stop_reason()
            except BaseException:
                # Cancelled run, timeout, lost API server: nothing may keep running unowned.
                client.delete(name, ns)
                raise
            if self.delete_on_completion:
                client.delete(name, ns)
        result = segment_result(followed, launch, stopped=stopped)
        context.log.info(f"segment {job.name} -> step {end_step}: {result.outcome.value}")
        if not result.ok:
            raise segment_failure(result)
        return SegmentRun(result=result, pipes=PipesClientCompletedInvocation(session))

    def stop_segments(self, job_name: str, *, reason: str) -> list[str]:
        """Stop the job's running segments as a preemption does (see the module docstring);
        returns the JobSets asked to stop now. Repeating it is cheap (one delete each)."""
        runs = self.site().runs_dir(job_name)
        if not followed_jobsets(runs):
            return []  # nothing launched from this machine: no API server to reach
        return stop_jobsets(self.jobset_client(), runs, reason=reason)

    def _follow(self, context, client: JobSetClient, name: str, ns: str, read_leader,
                kueue: KueueEventLog):
        def on_status(status):
            context.log.info(f"JobSet {name}: {status.phase}, {status.restarts} restart(s) "
                             f"{status.message}")
            kueue(status)

        return client.follow(name, ns, on_leader_pod=read_leader, poll_s=self.poll_interval_s,
                             timeout_s=self.timeout_s, on_status=on_status)
