"""Turn the seed's job body into a JobSpec, naming the body's own fields in every error.

    model             -> model.size (vocab_size from the data mix's tokenizer)
    gpus              -> parallelism.nnodes x nproc_per_node (gpus_per_node per node, default 8)
    parallelism       -> tp, pp, dp_shard (= dp; dp_replicate 1)
    checkpoint_every_steps -> checkpoint.every_steps
    data_manifest     -> data (the mix's data spec)
    seq_len           -> training.seq_len (must be the mix's; default: the mix's)
    global_batch_tokens / global_batch_size -> training.global_batch_size
    training_tokens / steps -> training.steps
    segment_steps     -> training.segment_steps
    precision         -> parallelism.mixed_precision
    priority, tenant  -> priority, tenant, owner; cluster.namespace / local_queue per tenant

The mix must be published in the job store (the site's), where the trainer finds it by
`mix_key(job)`; the mapping checks that the key it derives is the manifest's own.
Default batch: micro_batch_size 4 and the smallest global batch >= 16 that every dp rank
and pipeline stage divides (dp x micro x pp, times an integer).
"""

from __future__ import annotations

import json
import math
import re

from fm_pipeline.api.errors import FieldError
from fm_pipeline.api.schemas import JobCreate
from fm_pipeline.config import JobSpec, JobSpecError, parse_job
from fm_pipeline.model.registry import model_names
from fm_pipeline.scheduling.kueue import local_queue_name
from fm_pipeline.scheduling.tenants import TenantSpec
from fm_pipeline.storage import ObjectStore, StoreError

DEFAULT_GPUS_PER_NODE = 8
DEFAULT_MICRO_BATCH = 4
MIN_GLOBAL_BATCH = 16
_MIX_KEY = re.compile(r"^[0-9a-f]{16}$")

# JobSpec field -> the body field the user wrote.
_BODY_FIELD = {
    "model": "model", "parallelism.tp": "parallelism.tp", "parallelism.pp": "parallelism.pp",
    "parallelism.dp_shard": "parallelism.dp", "parallelism.nnodes": "gpus",
    "parallelism.nproc_per_node": "gpus", "parallelism": "parallelism",
    "parallelism.pp_microbatches": "global_batch_size", "checkpoint.every_steps":
    "checkpoint_every_steps", "training.seq_len": "data_manifest", "data": "data_manifest",
    "training.global_batch_size": "global_batch_size",
    "training.micro_batch_size": "micro_batch_size", "training.steps": "steps",
    "training.segment_steps": "segment_steps",
    "training.warmup_steps": "steps", "priority": "priority",
    "parallelism.mixed_precision": "precision",
}


def _body_field(spec_field: str) -> str:
    for prefix in sorted(_BODY_FIELD, key=len, reverse=True):
        if spec_field == prefix or spec_field.startswith(prefix + "."):
            return _BODY_FIELD[prefix]
    return spec_field


def mix_key_of(data_manifest: str, store_root: str) -> str:
    """The mix key a data_manifest names; it must live in the job store `store_root`."""
    ref = data_manifest.strip()
    root = store_root.rstrip("/")
    if ref.startswith(root + "/"):
        ref = ref[len(root) + 1:]
    elif ref.startswith(("s3://", "/", "file://")):
        raise FieldError([("data_manifest", (
            f"{data_manifest!r} is outside the job store {root}; the trainer reads the mix "
            "from there (publish it with `fm data prepare`)"
        ))])
    ref = ref.removesuffix("/manifest.json").removeprefix("data/")
    if not _MIX_KEY.fullmatch(ref):
        raise FieldError([("data_manifest", (
            f"{data_manifest!r} names no mix: give <store>/data/<mix_key>/manifest.json, "
            "data/<mix_key>/manifest.json or the 16-hex-digit mix key"
        ))])
    return ref


def read_mix_manifest(key: str, store: ObjectStore):
    from fm_pipeline.data import MixManifest
    from fm_pipeline.data.manifest import manifest_key

    try:
        raw = store.get_bytes(manifest_key(key))
    except StoreError:
        raise FieldError([("data_manifest", (
            f"no published mix {key} in {store.uri} (manifest.json missing); "
            "prepare it with `fm data prepare --job JOB.yaml`"
        ))]) from None
    try:
        return MixManifest.model_validate(json.loads(raw))
    except ValueError as e:
        first = str(e).splitlines()[0]
        raise FieldError([("data_manifest", f"mix {key} has an unreadable manifest: {first}")]) from None


def default_global_batch(dp: int, pp: int, micro: int) -> int:
    unit = dp * micro * pp
    return unit * math.ceil(MIN_GLOBAL_BATCH / unit)


def to_job_spec(body: JobCreate, *, job_id: str, tenant: TenantSpec,
                store: ObjectStore, problems: list | None = None,
                cluster: dict | None = None) -> JobSpec:
    """The JobSpec for `body`; FieldError names the body's fields (never the JobSpec's),
    every problem at once: `problems` already found (the pool's) come first. `cluster`:
    the job-spec cluster section of the pool (tenants config), under the job's own keys."""
    problems = list(problems or [])
    cluster = dict(cluster or {})
    if body.priority not in tenant.priorities:
        problems.append(("priority", (
            f"tenant {tenant.name} may use priorities {', '.join(tenant.priorities)}, "
            f"not {body.priority!r}"
        )))
    if body.model not in model_names():
        problems.append(("model", f"unknown model size {body.model!r}; known sizes: "
                                  f"{', '.join(model_names())}"))
    per_node = body.gpus_per_node or min(body.gpus,
                                         int(cluster.get("gpus_per_node", DEFAULT_GPUS_PER_NODE)))
    if body.gpus % per_node:
        problems.append(("gpus", (
            f"{body.gpus} is not a whole number of nodes of {per_node} GPUs (gpus_per_node)"
        )))
    p = body.parallelism
    dp = p.dp or body.gpus // (p.tp * p.pp)
    if body.gpus % (p.tp * p.pp):
        problems.append(("parallelism", (
            f"tp {p.tp} x pp {p.pp} = {p.tp * p.pp} must divide gpus ({body.gpus})"
        )))
    elif p.tp * p.pp * dp != body.gpus:
        problems.append(("parallelism.dp", (
            f"tp {p.tp} x pp {p.pp} x dp {dp} = {p.tp * p.pp * dp} must equal gpus ({body.gpus})"
        )))
    try:
        manifest = read_mix_manifest(mix_key_of(body.data_manifest, store.uri), store)
    except FieldError as e:
        problems += e.problems
    if problems:  # the spec's own rules need a layout, a model and a mix to check against
        raise FieldError(problems)
    micro = body.micro_batch_size or DEFAULT_MICRO_BATCH
    training = _training(body, manifest, dp=dp, pp=p.pp, micro=micro)
    parallelism = {"nnodes": body.gpus // per_node, "nproc_per_node": per_node,
                   "tp": p.tp, "pp": p.pp, "dp_shard": dp}
    if body.precision is not None:
        parallelism["mixed_precision"] = body.precision
    data = {
        "name": job_id, "owner": tenant.name, "tenant": tenant.name, "priority": body.priority,
        "model": {"size": body.model, "vocab_size": manifest.vocab_size},
        "parallelism": parallelism,
        "training": training,
        "data": manifest.data_spec,
        "checkpoint": {"every_steps": body.checkpoint_every_steps},
        "cluster": {**cluster, "gpus_per_node": per_node, "namespace": tenant.k8s_namespace,
                    "local_queue": local_queue_name(tenant.name)},
    }
    try:
        job = parse_job(data, source=f"job {job_id}")
    except JobSpecError as e:
        raise FieldError([(_body_field(f), m) for f, m in e.problems]) from None
    _check_mix_key(job, manifest)
    return job


def _training(body: JobCreate, manifest, *, dp: int, pp: int, micro: int) -> dict:
    """The training section: sequence length, batch and length, from what the body declares
    (seq_len, global_batch_tokens or global_batch_size, training_tokens or steps); every
    conflict named at once."""
    problems = []
    seq_len = body.seq_len or manifest.seq_len
    if seq_len != manifest.seq_len:
        problems.append(("seq_len", (
            f"{seq_len}, but mix {manifest.key} was prepared at seq_len {manifest.seq_len} "
            f"(its samples are windows of that length): prepare a mix with "
            f"training.seq_len: {seq_len} (`fm data prepare`) and name it")))
    gbs = body.global_batch_size
    if body.global_batch_tokens is not None:
        if body.global_batch_tokens % seq_len:
            problems.append(("global_batch_tokens", (
                f"{body.global_batch_tokens} is not a whole number of sequences of "
                f"{seq_len} tokens")))
        elif gbs is not None and gbs * seq_len != body.global_batch_tokens:
            problems.append(("global_batch_tokens", (
                f"{body.global_batch_tokens} disagrees with global_batch_size {gbs} x "
                f"seq_len {seq_len} = {gbs * seq_len}; give one of them")))
        else:
            gbs = body.global_batch_tokens // seq_len
    gbs = gbs or default_global_batch(dp, pp, micro)
    steps = body.steps
    if body.training_tokens is not None:
        from_tokens = math.ceil(body.training_tokens / (gbs * seq_len))
        if steps is not None and steps != from_tokens:
            problems.append(("training_tokens", (
                f"{body.training_tokens:,} tokens at {gbs * seq_len:,} per step is "
                f"{from_tokens:,} steps, but steps says {steps:,}; give one of them")))
        steps = from_tokens
    if problems:
        raise FieldError(problems)
    training = {"seq_len": seq_len, "micro_batch_size": micro, "global_batch_size": gbs}
    if steps is not None:
        training["steps"] = steps
        training["warmup_steps"] = min(10, steps)
    if body.segment_steps is not None:
        training["segment_steps"] = body.segment_steps
    return training


def _check_mix_key(job: JobSpec, manifest) -> None:
    from fm_pipeline.data import mix_key

    if mix_key(job) != manifest.key:
        raise FieldError([("data_manifest", (
            f"mix {manifest.key} does not match the job it would feed (its data spec, "
            f"vocab_size or seq_len differ: the job's key is {mix_key(job)})"
        ))])
