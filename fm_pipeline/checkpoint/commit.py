"""Turning written DCP files into a committed checkpoint: per-rank hashes, then the manifest.

Each rank hashes the files it wrote (`__<rank>_*.distcp`; rank 0 also `.metadata` and the
probe batch), so hashing scales with the number of ranks. Rank 0 gathers the entries and
writes `manifest.json` last; until then the directory is not a checkpoint.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from fm_pipeline.checkpoint.layout import DCP_METADATA, MANIFEST, PROBE_FILE, is_content_file
from fm_pipeline.checkpoint.manifest import (
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
    file_entry,
    now_iso,
)


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


def write_probe(directory: Path, probe: Probe) -> None:
    torch.save(probe.tokens.detach().to("cpu", torch.int64).clone(), directory / PROBE_FILE)


def own_files(directory: Path, rank: int) -> list[str]:
    names = sorted(p.name for p in directory.glob(f"__{rank}_*.distcp"))
    if rank == 0:
        names += [n for n in (DCP_METADATA, PROBE_FILE) if (directory / n).is_file()]
    return names


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_and_hash(directory: Path, names: list[str], *,
                   algorithm: str = "crc32c") -> list[FileEntry]:
    """Make this rank's files durable and checksum them at once: fsync waits on the disk while
    the checksum reads the same bytes from the page cache (both release the GIL)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fm-ckpt-fsync") as pool:
        synced = [pool.submit(_fsync, directory / n) for n in names]
        entries = [file_entry(directory, n, algorithm) for n in names]
        for f in synced:
            f.result()
    _fsync(directory)  # the renames of .metadata and of the files themselves
    return entries


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


def parallelism_info(job, *, world_size: int, mesh=None) -> ParallelismInfo:
    p = job.parallelism
    mesh_info = None
    if mesh is not None:
        mesh_info = MeshInfo(dim_names=list(mesh.mesh_dim_names or ()), shape=list(mesh.shape))
    return ParallelismInfo(
        world_size=world_size, nnodes=p.nnodes, nproc_per_node=p.nproc_per_node,
        dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, tp=p.tp, pp=p.pp,
        pp_schedule=p.pp_schedule, pp_virtual_stages=p.pp_virtual_stages,
        mixed_precision=p.mixed_precision, mesh=mesh_info,
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


def commit_local(directory: Path, manifest: Manifest) -> None:
    """Write the manifest after checking it covers exactly the files on disk."""
    on_disk = {p.name for p in directory.iterdir() if p.is_file() and is_content_file(p.name)}
    listed = {e.path for e in manifest.files}
    if on_disk != listed:
        raise RuntimeError(
            f"{directory}: files on disk and gathered hashes differ: only on disk "
            f"{sorted(on_disk - listed)}, only hashed {sorted(listed - on_disk)}")
    atomic_write(directory / MANIFEST, manifest.to_json())
