"""Evaluate a checkpoint (or the initial model) in a fresh process and record the result.

    result = evaluate_checkpoint(ref, site=site, job=job)   # a CheckpointRef, directory, prefix
    result.domains["code"].loss, result.domains["code"].perplexity
    baseline = evaluate_at_init(job, site=site)              # the model before its first step

The worker (fm_pipeline.eval.worker) runs as `python -m` for one rank or under torchrun for
several, so the caller never joins a process group (the Dagster step stays clean), with the
caller's Site in its environment. A store checkpoint is downloaded into its job's local tier
and verified first. The result is written as the checkpoint's
`eval` mark in both tiers (retention then keeps the checkpoint).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fm_pipeline.catalog import CheckpointInvalid, CheckpointRef, read_manifest, write_mark
from fm_pipeline.catalog.validate import Problem, model_problems
from fm_pipeline.config.strict_yaml import dump_yaml
from fm_pipeline.eval.result import EvalResult
from fm_pipeline.eval.worker import INVALID_EXIT
from fm_pipeline.rundir.torchrun import torchrun_executable

WORKER = "fm_pipeline.eval.worker"


class EvaluationFailed(RuntimeError):
    """The evaluation workers crashed or wrote no result; the message has their output."""


def _command(nproc: int, args: list[str]) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", WORKER, *args]
    return [*torchrun_executable(), "--standalone",
            f"--nproc-per-node={nproc}", "-m", WORKER, *args]


def _launch(args: list[str], *, site, nproc: int, timeout_s: float) -> dict:
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    with tempfile.TemporaryDirectory(prefix="fm-eval-") as tmp:
        out = Path(tmp) / "result.json"
        # One thread per rank unless told otherwise: on shared cores more threads contend.
        env = {"OMP_NUM_THREADS": "1", **os.environ, **site.env()}
        env.pop("DAGSTER_PIPES_CONTEXT", None)  # the workers report through the result file
        try:
            proc = subprocess.run(_command(nproc, [*args, "--out", str(out)]), env=env,
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise EvaluationFailed(f"evaluation timed out after {timeout_s:.0f} s") from e
        data = json.loads(out.read_text()) if out.is_file() else None
        if proc.returncode not in (0, INVALID_EXIT) or data is None:
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise EvaluationFailed(f"evaluation workers exited {proc.returncode}:\n{tail}")
        return data


def _resolve(checkpoint, store) -> CheckpointRef:
    if isinstance(checkpoint, CheckpointRef):
        return checkpoint
    text = str(checkpoint)
    if store is not None and not Path(text).exists():
        return CheckpointRef.remote(store, text.removeprefix(store.uri).strip("/"))
    return CheckpointRef.local(text)


def evaluate_checkpoint(checkpoint, *, site, job=None, store=None, nproc: int = 1,
                        max_batches: int = 8, batch_size: int | None = None,
                        timeout_s: float = 900.0) -> EvalResult:
    """Held-out loss and perplexity per domain of a committed checkpoint. Raises
    CheckpointInvalid (naming each problem) for a checkpoint of another model or one that
    fails its checksums while restoring; EvaluationFailed if the workers crash."""
    (result,) = evaluate_checkpoints([checkpoint], site=site, job=job, store=store, nproc=nproc,
                                     max_batches=max_batches, batch_size=batch_size,
                                     timeout_s=timeout_s)
    return result


def evaluate_checkpoints(checkpoints, *, site, job=None, store=None, nproc: int = 1,
                         max_batches: int = 8, batch_size: int | None = None,
                         timeout_s: float = 900.0) -> list[EvalResult]:
    """evaluate_checkpoint for several checkpoints of one job in one launch of the workers
    (start-up, torch's import, the model and the data mix paid once). Each valid one is
    scored and marked; then CheckpointInvalid names the first that was not, if any."""
    from fm_pipeline.catalog.tiering import local_copy

    store = store if store is not None else site.store()
    refs = [_resolve(c, store) for c in checkpoints]
    if not refs:
        return []
    locals_ = []
    for ref in refs:
        if problems := model_problems(read_manifest(ref), job):
            raise CheckpointInvalid(ref, problems)
        locals_.append(local_copy(ref, site=site)[0])
    args = [a for local in locals_ for a in ("--checkpoint", str(local.dir))]
    args += ["--max-batches", str(max_batches),
             "--store", store.uri]
    if batch_size:
        args += ["--batch-size", str(batch_size)]
    data = _launch(args, site=site, nproc=nproc, timeout_s=timeout_s)
    if "invalid" in data:  # before any checkpoint was looked at (the first manifest)
        raise CheckpointInvalid(refs[0], [Problem(w, m) for w, m in data["invalid"]])
    results, invalid = [], None
    for ref, local, entry in zip(refs, locals_, data["results"], strict=True):
        if "invalid" in entry:
            invalid = invalid or CheckpointInvalid(
                ref, [Problem(where, msg) for where, msg in entry["invalid"]])
            continue
        result = EvalResult.from_dict(entry)
        result.checkpoint = ref.location
        payload = result.to_dict()
        for target in {id(r): r for r in (ref, local)}.values():
            write_mark(target, "eval", payload)
        results.append(result)
    if invalid is not None:
        raise invalid
    return results


def evaluate_at_init(job, *, site, store=None, nproc: int = 1, max_batches: int = 8,
                     batch_size: int | None = None, timeout_s: float = 900.0) -> EvalResult:
    """The same evaluation of the model as training initialises it (step 0, the job's seed)."""
    from fm_pipeline.config import dump_job

    with tempfile.TemporaryDirectory(prefix="fm-eval-job-") as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_text(dump_yaml(dump_job(job)))
        args = ["--job", str(path), "--at-init", "--max-batches", str(max_batches),
                "--store", (store if store is not None else site.store()).uri]
        if batch_size:
            args += ["--batch-size", str(batch_size)]
        (result,) = _launch(args, site=site, nproc=nproc, timeout_s=timeout_s)["results"]
        return EvalResult.from_dict(result)
