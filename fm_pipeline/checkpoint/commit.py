"""Turning written DCP files into a committed checkpoint: per-rank entries, then the manifest.

Each rank's files are checksummed as they are written (writer.py) and are durable when the
write returns; the ranks' (name, size, checksum) entries are gathered to rank 0 over the
checkpoint's gloo group, and rank 0 writes `manifest.json` last, once every rank reported
success and the entries cover exactly the files `.metadata` references. Until then the
directory is not a checkpoint. Nothing here needs to see another node's disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fm_pipeline.catalog.manifest import (
    FORMAT,
    DataInfo,
    FileEntry,
    Manifest,
    MeshInfo,
    ModelInfo,
    ParallelismInfo,
    ProbeInfo,
    Timings,
    atomic_write,
    code_version,
    now_iso,
)
from fm_pipeline.catalog.refs import DCP_METADATA, MANIFEST, PROBE_FILE, is_content_file
from fm_pipeline.checkpoint.writer import write_file


@dataclass(frozen=True)
class Probe:
    """A fixed held-out batch ([batch, seq_len + 1] token ids) and the loss the trainer
    computed on it at the step being saved; the restore drill recomputes that loss."""

    tokens: torch.Tensor
    loss: float

    def __post_init__(self):
        if self.tokens.dim() != 2 or self.tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"probe tokens must be an integer [batch, seq_len + 1] tensor, got "
                f"{self.tokens.dtype} {list(self.tokens.shape)}")
        if not torch.isfinite(torch.tensor(self.loss)):
            raise ValueError(f"probe loss must be finite, got {self.loss}")


def write_probe(directory: Path, probe: Probe, *, algorithm: str = "crc32c") -> FileEntry:
    tokens = probe.tokens.detach().to("cpu", torch.int64).clone()
    return write_file(directory / PROBE_FILE, lambda f: torch.save(tokens, f),
                      algorithm=algorithm)


@dataclass(frozen=True)
class SaveContext:
    """What the trainer knows at save() time; combined with the gathered files at commit."""

    job_spec: dict
    job_name: str
    step: int
    tokens_seen: int
    state_keys: list[str]
    parallelism: ParallelismInfo
    model: ModelInfo
    data: DataInfo
    probe_loss: float | None
    probe_shape: list[int] | None
    started_at: float  # perf_counter() when save() was called
    waited_s: float  # for the previous save to finish
    blocked_s: float | None  # None for a sync save: blocked until the manifest is written
    async_save: bool
    stage_s: float = 0.0  # host copy after save() returned (overlapped staging)
    probe_entry: FileEntry | None = None  # rank 0: probe.pt as written by save()


def parallelism_info(job, *, world_size: int, mesh=None) -> ParallelismInfo:
    p = job.parallelism
    mesh_info = None
    if mesh is not None:
        mesh_info = MeshInfo(dim_names=list(mesh.mesh_dim_names or ()), shape=list(mesh.shape))
    return ParallelismInfo(
        world_size=world_size, nnodes=p.nnodes, nproc_per_node=p.nproc_per_node,
        dp_replicate=p.dp_replicate, dp_shard=p.resolved_dp_shard, tp=p.tp, pp=p.pp,
        pp_schedule=p.pp_schedule, pp_virtual_stages=p.pp_virtual_stages,
        mixed_precision=p.mixed_precision, mesh=mesh_info, ep=p.ep,
        pp_layers_per_stage=p.pp_layers_per_stage,
    )


def build_manifest(ctx: SaveContext, entries: list[FileEntry], *, write_s: float,
                   checksum_s: float, commit_s: float) -> Manifest:
    entries = sorted(entries, key=lambda e: e.path)
    probe = None
    if ctx.probe_loss is not None:
        probe = ProbeInfo(file=PROBE_FILE, loss=ctx.probe_loss, batch_shape=ctx.probe_shape)
    return Manifest(
        format=FORMAT, job=ctx.job_name, step=ctx.step, tokens_seen=ctx.tokens_seen,
        created_at=now_iso(), state_keys=ctx.state_keys, parallelism=ctx.parallelism,
        model=ctx.model, data=ctx.data, probe=probe, code=code_version(),
        timings=Timings(blocked_s=round(commit_s if ctx.blocked_s is None else ctx.blocked_s, 6),
                        waited_s=round(ctx.waited_s, 6), stage_s=round(ctx.stage_s, 6),
                        write_s=round(write_s, 6),
                        checksum_s=round(checksum_s, 6), commit_s=round(commit_s, 6),
                        async_save=ctx.async_save),
        job_spec=ctx.job_spec, files=entries, total_bytes=sum(e.size for e in entries),
    )


def commit_local(directory: Path, manifest: Manifest, *, referenced: set[str] | None,
                 all_files_here: bool) -> None:
    """Write the manifest after checking the gathered entries: they must be exactly the data
    files `.metadata` references (plus `.metadata` and the probe), and the directory must hold
    nothing else. `all_files_here`: every rank wrote into this directory (one copy), so every
    listed file must be here too."""
    listed = {e.path for e in manifest.files}
    if referenced is not None:
        data = listed - {DCP_METADATA, PROBE_FILE}
        if data != referenced:
            raise RuntimeError(
                f"{directory}: .metadata references {sorted(referenced - data)} that no rank "
                f"reported, and ranks reported {sorted(data - referenced)} it does not reference")
    on_disk = {p.name for p in directory.iterdir() if p.is_file() and is_content_file(p.name)}
    problems = []
    if extra := on_disk - listed:
        problems.append(f"files no rank reported writing: {sorted(extra)}")
    if all_files_here and (missing := listed - on_disk):
        problems.append(f"reported files that are not on disk: {sorted(missing)}")
    if problems:
        raise RuntimeError(f"{directory}: " + "; ".join(problems))
    atomic_write(directory / MANIFEST, manifest.to_json())
