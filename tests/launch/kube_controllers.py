"""The controllers behind the kube-apiserver TEST DOUBLE, each following the real one's source.

What a segment on a real cluster goes through, reproduced so the client meets it here:
- Kueue's JobSet webhook suspends a JobSet that names a LocalQueue (kueue
  pkg/controller/jobs/jobset/jobset_webhook.go, Default -> jobframework.ApplyDefaultForSuspend);
  admission unsuspends it and merges the flavour's node selectors into every replicated
  job's pod template (jobset_controller.go in the same directory, RunWithPodSetsInfo);
  preemption (eviction) suspends it again and restores the templates (Suspend,
  RestorePodSetsInfo; jobframework/reconciler.go stops the job on eviction).
- The JobSet controller (kubernetes-sigs/jobset pkg/controllers/jobset_controller.go):
  one Job per replicated-job replica named `<jobset>-<replicatedJob>-<jobIndex>`
  (constructJob, placement.GenJobName), labelled and annotated by labelAndAnnotateObject
  (jobset-name, replicatedjob-name, restart-attempt = status.restarts, replicas, job-index,
  job-key, job-global-index), created suspended while the JobSet is (constructJob) and
  suspended/resumed with it (suspendJobs, resumeJob: the template's labels, annotations,
  node selector and tolerations merged in first); the headless Service
  (createHeadlessSvcIfNecessary); Jobs of an older restart attempt deleted in the
  foreground, new ones only once they are gone under BlockingRecreate
  (constructJobsFromTemplate); Completed when every Job succeeded (success policy All);
  the failure policy (pkg/controllers/failure_policy.go): the first rule whose
  onJobFailureReasons (and message patterns) match a failed Job decides, else
  RestartJobSet; a restart increments status.restarts (and restartsCountTowardsMax unless
  RestartJobSetAndIgnoreMaxRestarts); past maxRestarts the JobSet fails
  (ReachedMaxRestarts) with terminalState Failed.
- The Job controller (kubernetes pkg/controller/job/job_controller.go, indexed_job_utils.go):
  an Indexed Job's pod per index, named `<job>-<index>-<5 random>`, hostname
  `<job>-<index>`, labelled batch.kubernetes.io/job-completion-index (also annotated),
  job-name and controller-uid; a suspended Job's active pods deleted; with backoffLimit 0
  the first failed pod fails the Job (BackoffLimitExceeded), or a podFailurePolicy FailJob
  rule on a pod condition does (PodFailurePolicy, "Pod ns/name has condition ... matching
  FailJob rule at index N"); a failed Job's remaining pods are deleted; Complete once
  every index succeeded.
- The garbage collector: dependents go with their owner; a foreground delete keeps the
  owner (deletionTimestamp, finalizer foregroundDeletion) until they are gone.
Pods are deleted gracefully: one that never started goes at once, a running one gets
deletionTimestamp and its terminationGracePeriodSeconds, and the kubelet (the test, or
`instant_kubelet`) ends it.
"""

from __future__ import annotations

import copy
import random
import re
import string
import uuid

JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
RESTARTS_LABEL = "jobset.sigs.k8s.io/restart-attempt"
RJOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _cond(obj: dict, kind: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind and c["status"] == "True":
            return c
    return None


def _set_condition(obj: dict, kind: str, status: str, reason: str, message: str,
                   now: str) -> bool:
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    for c in conditions:
        if c["type"] == kind:
            if (c["status"], c["reason"]) == (status, reason):
                return False
            c.update(status=status, reason=reason, message=message, lastTransitionTime=now)
            return True
    conditions.append({"type": kind, "status": status, "reason": reason, "message": message,
                       "lastTransitionTime": now})
    return True


def _owned_by(obj: dict, owner: dict) -> bool:
    uid = owner["metadata"]["uid"]
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def _owner_ref(owner: dict) -> dict:
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def _merge(into: dict | None, extra: dict | None) -> dict:
    return {**(into or {}), **(extra or {})}


class Controllers:
    """Run after every write until nothing changes (one consistent ordering of the events
    the real controllers would react to)."""

    def __init__(self, api):
        self.api = api
        self.pod_failures_seen = 0

    def reconcile(self) -> None:
        for _ in range(50):
            changed = False
            for key in list(self.api.jobsets):
                if key in self.api.jobsets:
                    changed |= self._jobset(self.api.jobsets[key])
            for key in list(self.api.jobs):
                if key in self.api.jobs:
                    changed |= self._job(self.api.jobs[key])
            if not changed:
                return
        raise RuntimeError("controllers did not settle (a reconcile loop never converges)")

    # -- Kueue --------------------------------------------------------------------------

    def kueue_webhook(self, jobset: dict) -> None:
        """A JobSet naming a queue is created suspended, until its Workload is admitted."""
        if (jobset["metadata"].get("labels") or {}).get(QUEUE_LABEL):
            jobset["spec"]["suspend"] = True
            self.api.workloads[self._key(jobset)] = {"admitted": False, "evictions": [],
                                                     "selectors": None}

    def kueue_admit(self, jobset: dict, node_selector: dict[str, str]) -> None:
        """RunWithPodSetsInfo: unsuspend, the flavour's node labels into every template.
        (Topology-aware scheduling is the real Kueue's, tested on the dev cluster:
        tests/devcluster/test_refusals.py.)"""
        workload = self.api.workloads[self._key(jobset)]
        templates = [rj["template"]["spec"]["template"] for rj in jobset["spec"]["replicatedJobs"]]
        workload["selectors"] = [copy.deepcopy(t["spec"].get("nodeSelector")) for t in templates]
        for template in templates:
            template["spec"]["nodeSelector"] = _merge(template["spec"].get("nodeSelector"),
                                                      node_selector)
        jobset["spec"]["suspend"] = False
        workload["admitted"] = True

    def kueue_evict(self, jobset: dict, reason: str) -> None:
        """Suspend + RestorePodSetsInfo: the JobSet is suspended and its templates restored;
        the Workload goes back to the queue."""
        workload = self.api.workloads[self._key(jobset)]
        templates = [rj["template"]["spec"]["template"] for rj in jobset["spec"]["replicatedJobs"]]
        for template, selector in zip(templates, workload["selectors"] or []):
            if selector is None:
                template["spec"].pop("nodeSelector", None)
            else:
                template["spec"]["nodeSelector"] = selector
        jobset["spec"]["suspend"] = True
        workload.update(admitted=False)
        workload["evictions"].append(reason)

    # -- JobSet controller ----------------------------------------------------------------

    def _key(self, obj: dict) -> tuple[str, str]:
        return obj["metadata"]["namespace"], obj["metadata"]["name"]

    def _jobset(self, js: dict) -> bool:
        api, meta, spec = self.api, js["metadata"], js["spec"]
        if meta.get("deletionTimestamp"):
            return False  # jobSetMarkedForDeletion: the garbage collector's now
        status = js.setdefault("status", {})
        restarts = int(status.get("restarts") or 0)
        owned = [j for j in api.jobs.values() if _owned_by(j, js)]
        previous = [j for j in owned if int(j["metadata"]["labels"][RESTARTS_LABEL]) < restarts]
        current = [j for j in owned if j not in previous]
        failed = [j for j in current if _cond(j, "Failed")]
        succeeded = [j for j in current if _cond(j, "Complete")]
        active = [j for j in current if j not in failed and j not in succeeded]
        changed = self._replicated_jobs_status(js, active, succeeded, failed)
        if status.get("terminalState"):
            for job in active:
                changed |= api.delete_job(job, foreground=True)
            return changed
        for job in previous:
            changed |= api.delete_job(job, foreground=True)
        if failed:
            return self._failure_policy(js, failed) or changed
        total = sum(int(rj.get("replicas", 1)) for rj in spec["replicatedJobs"])
        if succeeded and len(succeeded) >= total:  # successPolicy operator All
            _set_condition(js, "Completed", "True", "AllJobsCompleted", "jobset completed",
                           api.now())
            status["terminalState"] = "Completed"
            api.written(js)
            return True
        changed |= api.headless_service(js)
        blocking = (spec.get("failurePolicy") or {}).get("restartStrategy") == "BlockingRecreate"
        if not (previous and blocking):
            names = {j["metadata"]["name"] for j in owned}
            for rj in spec["replicatedJobs"]:
                for index in range(int(rj.get("replicas", 1))):
                    if f"{meta['name']}-{rj['name']}-{index}" not in names:
                        api.create_job(self._construct_job(js, rj, index))
                        changed = True
        if spec.get("suspend"):
            for job in active:
                if not job["spec"].get("suspend"):
                    job["spec"]["suspend"] = True
                    api.written(job)
                    changed = True
            if _set_condition(js, "Suspended", "True", "SuspendedJobs", "jobset is suspended",
                              api.now()):
                api.written(js)
                changed = True
        else:
            templates = {rj["name"]: rj["template"]["spec"]["template"]
                         for rj in spec["replicatedJobs"]}
            for job in active:
                if job["spec"].get("suspend"):
                    self._resume_job(job, templates[job["metadata"]["labels"][RJOB_LABEL]])
                    changed = True
            if _cond(js, "Suspended") and _set_condition(
                    js, "Suspended", "False", "ResumeJobs", "jobset is resumed", api.now()):
                api.written(js)
                changed = True
        return changed

    def _replicated_jobs_status(self, js, active, succeeded, failed) -> bool:
        counts = {rj["name"]: {"name": rj["name"], "ready": 0, "succeeded": 0, "failed": 0,
                               "active": 0, "suspended": 0} for rj in js["spec"]["replicatedJobs"]}
        for job in active:
            row = counts[job["metadata"]["labels"][RJOB_LABEL]]
            job_status = job.get("status") or {}
            pods = min(int(job["spec"].get("parallelism", 1)),
                       int(job["spec"].get("completions", 1)))
            row["ready"] += job_status.get("succeeded", 0) + job_status.get("ready", 0) >= pods
            row["active"] += job_status.get("active", 0) > 0
            row["suspended"] += bool(job["spec"].get("suspend"))
        for job in succeeded:
            counts[job["metadata"]["labels"][RJOB_LABEL]]["succeeded"] += 1
        for job in failed:
            counts[job["metadata"]["labels"][RJOB_LABEL]]["failed"] += 1
        rows = list(counts.values())
        if js["status"].get("replicatedJobsStatus") == rows:
            return False
        js["status"]["replicatedJobsStatus"] = rows
        self.api.written(js)
        return True

    def _failure_policy(self, js: dict, failed: list[dict]) -> bool:
        policy = js["spec"].get("failurePolicy")
        status = js["status"]
        first = min(failed, key=lambda j: _cond(j, "Failed")["lastTransitionTime"])
        action = "RestartJobSet"
        if policy is None:
            action = "FailJobSet"
        for rule in (policy or {}).get("rules") or []:
            matched = [j for j in failed if self._rule_applies(rule, j)]
            if matched:
                first = min(matched, key=lambda j: _cond(j, "Failed")["lastTransitionTime"])
                action = rule["action"]
                break
        now = self.api.now()
        if action == "RestartJobSet" and int(status.get("restartsCountTowardsMax") or 0) >= \
                int(policy.get("maxRestarts", 0)):
            self._fail(js, "ReachedMaxRestarts",
                       f"jobset failed due to reaching max number of restarts (first failed "
                       f"job: {first['metadata']['name']})", now)
        elif action == "FailJobSet":
            self._fail(js, "FailedJobs" if policy is None else "FailJobSetAction",
                       f"jobset failed due to one or more job failures (first failed job: "
                       f"{first['metadata']['name']})", now)
        else:  # failurePolicyRecreateAll
            status["restarts"] = int(status.get("restarts") or 0) + 1
            if action == "RestartJobSet":
                status["restartsCountTowardsMax"] = int(
                    status.get("restartsCountTowardsMax") or 0) + 1
            self.api.written(js)
        return True

    @staticmethod
    def _rule_applies(rule: dict, job: dict) -> bool:
        failure = _cond(job, "Failed")
        reasons = rule.get("onJobFailureReasons") or []
        if reasons and failure["reason"] not in reasons:
            return False
        patterns = rule.get("onJobFailureMessagePatterns") or []
        if patterns and not any(re.search(p, failure.get("message", "")) for p in patterns):
            return False
        targets = rule.get("targetReplicatedJobs") or []
        return not targets or job["metadata"]["labels"][RJOB_LABEL] in targets

    def _fail(self, js: dict, reason: str, message: str, now: str) -> None:
        _set_condition(js, "Failed", "True", reason, message, now)
        js["status"]["terminalState"] = "Failed"
        self.api.written(js)

    def _construct_job(self, js: dict, rj: dict, index: int) -> dict:
        meta, name = js["metadata"], f"{js['metadata']['name']}-{rj['name']}-{index}"
        template = rj["template"]
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": name, "namespace": meta["namespace"],
                            "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                            "annotations": dict(
                                (template.get("metadata") or {}).get("annotations") or {}),
                            "ownerReferences": [_owner_ref(js)]},
               "spec": copy.deepcopy(template["spec"])}
        replicas = [int(r.get("replicas", 1)) for r in js["spec"]["replicatedJobs"]]
        position = [r["name"] for r in js["spec"]["replicatedJobs"]].index(rj["name"])
        stamp = {JOBSET_LABEL: meta["name"], RJOB_LABEL: rj["name"],
                 RESTARTS_LABEL: str(int(js["status"].get("restarts") or 0)),
                 RJOB_REPLICAS: str(int(rj.get("replicas", 1))),
                 GLOBAL_REPLICAS: str(sum(replicas)), JOB_INDEX: str(index),
                 JOB_KEY: uuid.uuid5(uuid.NAMESPACE_DNS, f"{meta['namespace']}/{name}").hex,
                 JOB_GLOBAL_INDEX: str(sum(replicas[:position]) + index)}
        pod_meta = job["spec"]["template"].setdefault("metadata", {})
        for target in (job["metadata"], pod_meta):
            target["labels"] = _merge(target.get("labels"), stamp)
            target["annotations"] = _merge(target.get("annotations"), stamp)
        network = js["spec"].get("network") or {}
        if network.get("enableDNSHostnames"):
            job["spec"]["template"]["spec"]["subdomain"] = network.get("subdomain") or meta["name"]
        job["spec"]["suspend"] = bool(js["spec"].get("suspend"))
        return job

    def _resume_job(self, job: dict, template: dict) -> None:
        pod = job["spec"]["template"]
        meta = pod.setdefault("metadata", {})
        meta["labels"] = _merge(meta.get("labels"), (template.get("metadata") or {}).get("labels"))
        meta["annotations"] = _merge(meta.get("annotations"),
                                     (template.get("metadata") or {}).get("annotations"))
        pod["spec"]["nodeSelector"] = _merge(pod["spec"].get("nodeSelector"),
                                             template["spec"].get("nodeSelector"))
        if not pod["spec"]["nodeSelector"]:
            del pod["spec"]["nodeSelector"]
        tolerations = pod["spec"].get("tolerations") or []
        for t in template["spec"].get("tolerations") or []:
            if t not in tolerations:
                tolerations.append(t)
        if tolerations:
            pod["spec"]["tolerations"] = tolerations
        job["spec"]["suspend"] = False
        self.api.written(job)

    # -- Job controller ---------------------------------------------------------------------

    def _job(self, job: dict) -> bool:
        api, spec = self.api, job["spec"]
        pods = [p for p in api.pods.values() if _owned_by(p, job)]
        if job["metadata"].get("deletionTimestamp"):
            changed = False
            for pod in pods:
                changed |= api.delete_pod_gracefully(pod)
            if not [p for p in api.pods.values() if _owned_by(p, job)]:
                api.remove_job(job)
                return True
            return changed
        if _cond(job, "Failed") or _cond(job, "Complete"):
            return self._job_status(job, pods)
        live = [p for p in pods if p["status"]["phase"] not in ("Succeeded", "Failed")
                and not p["metadata"].get("deletionTimestamp")]
        changed = False
        if spec.get("suspend"):
            for pod in live:
                changed |= api.delete_pod_gracefully(pod)
            if _set_condition(job, "Suspended", "True", "JobSuspended", "Job suspended",
                              api.now()):
                api.written(job)
                changed = True
            return self._job_status(job, pods) or changed
        failed = [p for p in pods if p["status"]["phase"] == "Failed"]
        if failed:
            first = failed[0]
            reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
            for i, rule in enumerate((spec.get("podFailurePolicy") or {}).get("rules") or []):
                wanted = {(c["type"], c.get("status", "True")) for c in rule.get(
                    "onPodConditions") or []}
                hit = [p for p in failed if wanted & {(c["type"], c["status"]) for c in
                                                      p["status"].get("conditions") or []}]
                if hit and rule["action"] == "FailJob":
                    first = hit[0]
                    kind = next(iter(wanted))[0]
                    reason = "PodFailurePolicy"
                    message = (f"Pod {first['metadata']['namespace']}/"
                               f"{first['metadata']['name']} has condition {kind} matching "
                               f"FailJob rule at index {i}")
                    break
            if reason == "PodFailurePolicy" or len(failed) > int(spec.get("backoffLimit", 6)):
                _set_condition(job, "Failed", "True", reason, message, api.now())
                api.written(job)
                for pod in live:
                    api.delete_pod_gracefully(pod)
                self._job_status(job, pods)
                return True
        done = {int(p["metadata"]["labels"][COMPLETION_INDEX]) for p in pods
                if p["status"]["phase"] == "Succeeded"}
        completions = int(spec.get("completions", 1))
        if len(done) >= completions:
            _set_condition(job, "Complete", "True", "", "", api.now())
            api.written(job)
            self._job_status(job, pods)
            return True
        have = {int(p["metadata"]["labels"][COMPLETION_INDEX]) for p in live} | done
        for index in range(completions):
            if index not in have:
                api.create_pod(self._construct_pod(job, index))
                changed = True
        if _cond(job, "Suspended") and _set_condition(job, "Suspended", "False", "JobResumed",
                                                      "Job resumed", api.now()):
            api.written(job)
            changed = True
        return self._job_status(job, [p for p in api.pods.values() if _owned_by(p, job)]) \
            or changed

    def _job_status(self, job: dict, pods: list[dict]) -> bool:
        live = [p for p in pods if p["status"]["phase"] not in ("Succeeded", "Failed")
                and not p["metadata"].get("deletionTimestamp")]
        counts = {"active": len(live),
                  "ready": sum(p["status"]["phase"] == "Running" for p in live),
                  "succeeded": sum(p["status"]["phase"] == "Succeeded" for p in pods),
                  "failed": sum(p["status"]["phase"] == "Failed" for p in pods)}
        status = job.setdefault("status", {})
        if all(status.get(k) == v for k, v in counts.items()):
            return False
        status.update(counts)
        self.api.written(job)
        return True

    def _construct_pod(self, job: dict, index: int) -> dict:
        template = copy.deepcopy(job["spec"]["template"])
        meta = template.get("metadata") or {}
        job_name = job["metadata"]["name"]
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        uid = job["metadata"]["uid"]
        labels = _merge(meta.get("labels"), {
            COMPLETION_INDEX: str(index), "batch.kubernetes.io/job-name": job_name,
            "batch.kubernetes.io/controller-uid": uid, "job-name": job_name,
            "controller-uid": uid})
        annotations = _merge(meta.get("annotations"), {COMPLETION_INDEX: str(index)})
        pod_spec = template["spec"]
        pod_spec["hostname"] = f"{job_name}-{index}"
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{job_name}-{index}-{suffix}",
                             "generateName": f"{job_name}-{index}-",
                             "namespace": job["metadata"]["namespace"], "labels": labels,
                             "annotations": annotations, "ownerReferences": [_owner_ref(job)]},
                "spec": pod_spec,
                "status": {"phase": "Pending"}}
