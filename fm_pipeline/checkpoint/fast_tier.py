"""The fast tier: in-memory snapshots every `checkpoint.memory_every_steps`, a replica on a
peer node, and the restore an in-job restart uses (docs/checkpoints.md, "Fast tier").

    fast = FastTier(job, app_state, topology=..., run_id=..., worker=WorkerEnv(...))
    restored = fast.restore(newer_than=durable_step)    # collective; None: use the durable
    ...
    fast.record_progress(step)                           # every step (a tmpfs write)
    if fast.due(step):
        fast.snapshot(step)                              # returns at once (overlapped copy)
    fast.close(discard=True)                             # at a clean end: frees the memory

Where: the launcher's directory (`FM_FAST_TIER_DIR`, config.worker_env), else
`/dev/shm/fm-fast` (tmpfs: memory that outlives the worker processes, which is what an
in-job restart needs; torchrun restarts the workers, not the node). Layout, per job and per torchrun run (a segment; snapshots of other runs are deleted
when a segment starts, and never restored):

    <root>/<job>/<run>/own/rank-00001/step-00000012.snap   this rank's local shards
                                      step-00000012.json   written last: the commit point
    <root>/<job>/<run>/held/rank-00003/step-...            a replica of rank 3 (another node)
    <root>/<job>/<run>/progress/rank-00001                 the last step this rank finished

Same commit rules as the durable tiers: a snapshot is its `.json` (size, CRC32C, step,
rank, topology, run) written after the bytes, verified on every read, never selected unless
it is complete and valid. At most two snapshots per rank are kept on a node, and two
replicas per peer. A snapshot is restored only by the same rank of the same topology and
run: it is the rank's local shards, not a resharding checkpoint.

Replicas: each node's ranks send every snapshot to the same local rank of the next node in
a ring that alternates racks where the placement names them (`FM_RACK`, or on Kubernetes
the node label named by `FM_RACK_LABEL`: fast_paths.node_rack), so one lost node
or rack leaves a copy elsewhere. The exchange runs in the snapshot's background thread on
the tier's own gloo group. With one node there is no replica (reported).

Restore (collective, before the first step): the newest step that every rank can load, from
a copy on its own node or, when that is missing or corrupt, from one another node holds
(sent to it over the group); a step where some rank has none falls to the next older one,
and none at all to the durable tiers. A node's memory is searched whole (own copies and
replicas of any rank): after a JobSet restart a pod may land where another rank ran.
Reasons are logged and returned.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import crc32c
import torch
import torch.distributed as dist

from fm_pipeline.catalog.manifest import atomic_write
from fm_pipeline.checkpoint import comm
from fm_pipeline.checkpoint.fast_paths import fast_root, node_rack, replica_peers
from fm_pipeline.config.worker_env import WorkerEnv
from fm_pipeline.checkpoint.fast_snapshot import (
    SnapshotMismatch,
    apply_snapshot,
    encode,
    split_state,
)
from fm_pipeline.checkpoint.staging import HostStager

log = logging.getLogger(__name__)

FORMAT = "fm-fast/1"
KEEP = 2  # snapshots per rank (and replicas per peer) on a node


@dataclass
class SnapshotResult:
    step: int
    committed: bool
    bytes: int = 0
    blocked_s: float = 0.0  # in snapshot(), plus the optimizer's wait for the host copy
    write_s: float = 0.0
    replicate_s: float = 0.0
    replica_held: bool = False  # this rank received and committed its source's replica
    error: str | None = None


@dataclass
class FastRestore:
    """What the fast tier restored (every rank gets the same)."""

    step: int
    tokens_seen: int
    source: str
    from_peer: list[int]  # ranks that loaded their peer's replica
    fetch_s: float
    load_s: float
    reached_step: int | None  # the newest step a rank had finished before the restart
    skipped: list[str] = field(default_factory=list)
    tier: str = "memory"
    resharded: bool = False

    @property
    def seconds(self) -> float:
        return self.fetch_s + self.load_s

    @property
    def steps_redone(self) -> int | None:
        return None if self.reached_step is None else max(0, self.reached_step - self.step)


def _step_name(step: int) -> str:
    return f"step-{step:08d}"


def _rank_name(rank: int) -> str:
    return f"rank-{rank:05d}"


class FastTier:
    def __init__(self, job, app_state: dict, *, topology: str, run_id: str,
                 worker: WorkerEnv = WorkerEnv(), every_steps: int | None = None,
                 root: Path | None = None):
        self.job, self.app_state = job, app_state
        self.topology, self.run_id = topology, run_id
        self.every_steps = job.checkpoint.memory_every_steps if every_steps is None \
            else every_steps
        self.rank, self.world_size = comm.rank(), comm.world_size()
        self.job_dir = Path(root or fast_root(worker)) / job.name
        self.dir = self.job_dir / run_id
        self.node = os.environ.get("GROUP_RANK") or socket.gethostname()
        if comm.local_rank() == 0:
            self._forget_other_runs()
        for sub in ("own", "held", "progress"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.job_dir, 0o700)
        # Its own group (the default one serves training), bounded like training's: a peer
        # that died mid-exchange fails the snapshot instead of hanging it for 30 minutes.
        self._group = dist.new_group(backend="gloo", timeout=timedelta(
            seconds=job.resilience.collective_timeout_s)) if comm.initialized() else None
        # One read per node (on Kubernetes an API call): local rank 0's, for all its ranks.
        rack = node_rack(worker) if comm.local_rank() == 0 else None
        where = comm.all_gather((self.node, rack))
        self.nodes = [w[0] for w in where]  # each rank's node
        rack_of = {node: rack for node, rack in where if rack is not None}
        self.peers = replica_peers(self.nodes, [rack_of.get(n) for n in self.nodes])
        self.peer = self.peers[self.rank]
        sources = [r for r, p in enumerate(self.peers) if p == self.rank]
        self.source = sources[0] if sources else None
        optim = app_state.get("optimizer")
        self._stager = HostStager(mode="overlap", optimizers=getattr(optim, "optimizers", []))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fm-fast",
                                            initializer=comm.single_threaded)
        self._inflight: Future | None = None
        self.results: list[SnapshotResult] = []
        self.skipped: list[tuple[int, str]] = []
        self.last_skipped: list[str] = []  # why the last restore found nothing
        self._held_at_close: int | None = None

    def _forget_other_runs(self) -> None:
        """Snapshots of other runs of this job on this node: never restorable, memory."""
        if not self.job_dir.is_dir():
            return
        for other in self.job_dir.iterdir():
            if other.name != self.run_id:
                shutil.rmtree(other, ignore_errors=True)

    # -- snapshots ----------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step > 0 and step % self.every_steps == 0

    def snapshot(self, step: int, *, tokens_seen: int) -> Future | None:
        """Start a snapshot of the current state as `step` (every rank, same step). Skipped,
        on every rank alike, while the previous one is still being written or sent."""
        t0 = time.perf_counter()
        if comm.any_rank(self._inflight is not None and not self._inflight.done()):
            self.skipped.append((step, "the previous snapshot is still in flight"))
            return None
        self._harvest()
        live = {k: v.state_dict() if hasattr(v, "state_dict") else v
                for k, v in self.app_state.items()}
        tensors, skeleton = split_state(live)
        staged = self._stager.stage(tensors)
        blocked = time.perf_counter() - t0
        self._inflight = self._executor.submit(self._persist, staged, skeleton, step,
                                               tokens_seen, blocked)
        return self._inflight

    def _persist(self, staged: Future, skeleton, step: int, tokens_seen: int,
                 blocked_s: float) -> SnapshotResult:
        result = SnapshotResult(step=step, committed=False, blocked_s=blocked_s)
        payload, info = b"", None
        t0 = time.perf_counter()
        try:
            payload = encode(staged.result(), skeleton)
            info = self._info(step, self.rank, tokens_seen, payload)
            self._commit(self.dir / "own" / _rank_name(self.rank), info, payload)
            result.committed, result.bytes = True, len(payload)
        except Exception as e:  # the exchange below must still happen on every rank
            result.error = f"{type(e).__name__}: {e}"
            log.error("fast snapshot of step %d failed on rank %d: %s", step, self.rank,
                      result.error)
        result.write_s = time.perf_counter() - t0
        if self.peer is not None:
            t1 = time.perf_counter()
            try:
                got = self._exchange(payload if result.committed else b"", info)
            except (RuntimeError, ValueError) as e:  # a peer gone or stuck: no replica
                got = None
                result.error = f"replica exchange: {type(e).__name__}: {e}"
                log.error("fast snapshot of step %d: %s", step, result.error)
            if got is not None:
                their_info, their_payload = got
                try:
                    self._check(their_info, their_payload, rank=their_info["rank"])
                    self._commit(self.dir / "held" / _rank_name(their_info["rank"]),
                                 their_info, their_payload)
                    result.replica_held = True
                except (ValueError, OSError) as e:
                    log.error("replica of rank %s for step %d not kept: %s", self.source,
                              step, e)
            result.replicate_s = time.perf_counter() - t1
        return result

    def _info(self, step: int, rank: int, tokens_seen: int, payload: bytes) -> dict:
        return {"format": FORMAT, "job": self.job.name, "run_id": self.run_id, "step": step,
                "rank": rank, "world_size": self.world_size, "topology": self.topology,
                "tokens_seen": tokens_seen, "size": len(payload),
                "crc32c": f"{crc32c.crc32c(payload):08x}", "node": self.node,
                "written_at": time.time()}

    def _commit(self, directory: Path, info: dict, payload: bytes | memoryview) -> None:
        """Bytes, then the info file (the commit point); then the oldest beyond KEEP go."""
        directory.mkdir(parents=True, exist_ok=True)
        name = _step_name(info["step"])
        (directory / f"{name}.json").unlink(missing_ok=True)
        with open(directory / f"{name}.snap", "wb") as f:
            f.write(payload)
        atomic_write(directory / f"{name}.json", json.dumps(info).encode())
        committed = sorted(p.stem for p in directory.glob("step-*.json"))
        for old in committed[:-KEEP]:
            (directory / f"{old}.json").unlink(missing_ok=True)  # uncommitted first
            (directory / f"{old}.snap").unlink(missing_ok=True)

    def _exchange(self, payload: bytes, info: dict | None) -> tuple[dict, memoryview] | None:
        """Send this snapshot to the peer, receive the source's (both at once: a ring)."""
        meta = json.dumps(info).encode() if info is not None and payload else b""
        header = torch.tensor([len(meta), len(payload)], dtype=torch.int64)
        theirs = torch.zeros(2, dtype=torch.int64)
        _wait([dist.isend(header, self.peer, group=self._group),
               dist.irecv(theirs, self.source, group=self._group)])
        n_meta, n_payload = (int(v) for v in theirs)
        out = torch.empty(n_meta + n_payload, dtype=torch.uint8)
        ops = []
        if meta:
            body = torch.frombuffer(bytearray(meta + payload), dtype=torch.uint8)
            ops.append(dist.isend(body, self.peer, group=self._group))
        if n_meta:
            ops.append(dist.irecv(out, self.source, group=self._group))
        _wait(ops)
        if not n_meta:
            return None
        raw = memoryview(out.numpy())
        return json.loads(bytes(raw[:n_meta])), raw[n_meta:]

    def _check(self, info: dict, payload, *, rank: int) -> None:
        problems = []
        for key, want in (("format", FORMAT), ("job", self.job.name), ("run_id", self.run_id),
                          ("rank", rank), ("world_size", self.world_size),
                          ("topology", self.topology)):
            if info.get(key) != want:
                problems.append(f"{key} is {info.get(key)!r}, expected {want!r}")
        if len(payload) != info.get("size"):
            problems.append(f"{len(payload)} bytes, the info says {info.get('size')}")
        elif f"{crc32c.crc32c(payload):08x}" != info.get("crc32c"):
            problems.append(f"CRC32C mismatch: bytes have {crc32c.crc32c(payload):08x}, the "
                            f"info says {info.get('crc32c')}")
        if problems:
            raise ValueError("; ".join(problems))

    def _harvest(self) -> None:
        if self._inflight is None:
            return
        fut, self._inflight = self._inflight, None
        result = fut.result()
        result.blocked_s += self._stager.take_wait_s()
        self.results.append(result)

    def record_progress(self, step: int) -> None:
        """Every step: a rename in memory (no fsync: the tier does not outlive the node)."""
        path = self.dir / "progress" / _rank_name(self.rank)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(step))
        os.replace(tmp, path)

    # -- restoring ----------------------------------------------------------------------------

    def _listed(self, directory: Path) -> dict[int, dict]:
        """step -> info of the committed snapshots in `directory` (info files only)."""
        out = {}
        for path in directory.glob("step-*.json"):
            try:
                info = json.loads(path.read_text())
                out[int(info["step"])] = info
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not committed, or not ours: never selected
        return out

    def _read_verified(self, directory: Path, step: int, rank: int) -> tuple[bytes | None, str]:
        name = _step_name(step)
        try:
            info = json.loads((directory / f"{name}.json").read_text())
            payload = (directory / f"{name}.snap").read_bytes()
            self._check(info, payload, rank=rank)
            return payload, ""
        except (OSError, ValueError) as e:
            return None, f"{directory / name}: {e}"

    def _copies(self) -> dict[int, dict[int, Path]]:
        """rank -> step -> the directory on this node with a committed copy of it: own copies
        and replicas alike, of any rank. After a JobSet restart a pod may land on a node that
        ran another rank before, so a node's memory is searched whole, not by role."""
        out: dict[int, dict[int, Path]] = {}
        for sub in ("held", "own"):  # own last: it wins where both hold a step
            for directory in (self.dir / sub).glob("rank-*"):
                try:
                    rank = int(directory.name.split("-")[1])
                except (IndexError, ValueError):
                    continue
                for step, info in self._listed(directory).items():
                    if info.get("run_id") == self.run_id:
                        out.setdefault(rank, {})[step] = directory
        return out

    def has_snapshots(self) -> bool:
        """Collective: whether any node holds a committed snapshot of this run, as after a
        JobSet restart recreated the pods (the node memory outlives them, launch/pod.py)."""
        return any(comm.all_gather(bool(self._copies())))

    def restore(self, *, newer_than: int | None = None) -> FastRestore | None:
        """Collective. Load the newest step every rank can load (a copy on its own node, else
        one another node holds, sent to it) that is not older than `newer_than` (the newest
        durable checkpoint); None when there is none, with the reasons logged."""
        copies = self._copies()
        reached = self.reached_step()
        everyone = comm.all_gather({r: set(v) for r, v in copies.items()})

        def holders(rank: int, step: int) -> list[int]:
            return [h for h, held in enumerate(everyone) if step in held.get(rank, set())]

        steps = set().union(*(s for held in everyone for s in held.values()))
        loadable = sorted((s for s in steps if all(
            holders(r, s) for r in range(self.world_size))), reverse=True)
        skipped: list[str] = []
        for step in loadable:
            if newer_than is not None and step < newer_than:
                skipped.append(f"step {step}: older than the durable checkpoint {newer_than}")
                break
            t0 = time.perf_counter()
            here = copies.get(self.rank, {}).get(step)
            payload, why = (self._read_verified(here, step, self.rank) if here is not None
                            else (None, f"{_rank_name(self.rank)} has no copy of step {step} "
                                        "on its node"))
            missing = comm.all_gather(why if payload is None else None)
            from_peer = [r for r, m in enumerate(missing) if m is not None]
            for rank in from_peer:  # in the same order on every rank: pairs always match
                reason = missing[rank]
                skipped.append(reason)
                # Another node's copy: one on the rank's own node is the one that failed.
                holder = [h for h in holders(rank, step) if self.nodes[h] != self.nodes[rank]]
                if not holder:
                    continue
                got = self._transfer(step, rank, holder[0], copies)
                if got is not None:
                    payload = got
            ok = comm.all_gather(payload is not None)
            fetch_s = time.perf_counter() - t0
            if not all(ok):
                lacking = [r for r, good in enumerate(ok) if not good]
                skipped.append(f"step {step}: no valid copy for rank(s) {lacking}")
                continue
            t1 = time.perf_counter()
            error = None
            try:
                with self.app_state["train_state"].restoring_from(self.topology) \
                        if "train_state" in self.app_state else contextlib.nullcontext():
                    apply_snapshot(self.app_state, payload)
            except (SnapshotMismatch, RuntimeError, ValueError) as e:
                error = f"rank {self.rank}: {type(e).__name__}: {e}"
            errors = [e for e in comm.all_gather(error) if e]
            if errors:  # tensors may be partly written: the caller must load over them
                raise RuntimeError(f"fast restore of step {step} failed: {errors[0]}")
            result = FastRestore(
                step=step, tokens_seen=int(self.app_state["train_state"].tokens_seen)
                if "train_state" in self.app_state else 0,
                source=f"memory:{self.dir}/{_step_name(step)}", from_peer=from_peer,
                fetch_s=fetch_s, load_s=time.perf_counter() - t1, reached_step=reached,
                skipped=skipped, tier="memory-peer" if from_peer else "memory")
            log.info("restored step %d from the fast tier in %.3fs (%s)%s", step,
                     result.seconds, result.tier,
                     f"; skipped: {'; '.join(skipped)}" if skipped else "")
            return result
        if not loadable:
            skipped.append("no step that every rank can load from memory")
        for line in skipped:
            log.warning("fast tier: %s", line)
        self.last_skipped = skipped
        return None

    def reached_step(self) -> int | None:
        """Collective: the newest step any rank of this run finished (progress files)."""
        progress = None
        try:
            progress = int((self.dir / "progress" / _rank_name(self.rank)).read_text())
        except (OSError, ValueError):
            pass
        return max((p for p in comm.all_gather(progress) if p is not None), default=None)

    def _transfer(self, step: int, rank: int, holder: int,
                  copies: dict[int, dict[int, Path]]) -> bytes | None:
        """`rank`'s copy of `step`, sent by `holder` from its node (collective over the pair)."""
        if self.rank == holder:
            where = copies.get(rank, {}).get(step)
            payload, why = ((None, f"no copy of rank {rank} step {step}") if where is None
                            else self._read_verified(where, step, rank))
            if payload is None:
                log.warning("fast tier: replica of rank %d: %s", rank, why)
            data = payload or b""
            dist.send(torch.tensor([len(data)], dtype=torch.int64), rank, group=self._group)
            if data:
                dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), rank,
                          group=self._group)
            return None
        if self.rank == rank:
            size = torch.zeros(1, dtype=torch.int64)
            dist.recv(size, holder, group=self._group)
            if not int(size):
                return None
            out = torch.empty(int(size), dtype=torch.uint8)
            dist.recv(out, holder, group=self._group)
            return out.numpy().tobytes()  # the holder verified it against its info
        return None

    # -- end ----------------------------------------------------------------------------------

    def held_bytes(self) -> int:
        """Bytes of this run's snapshots on this node. Tolerates files and directories going
        while it counts: the other local ranks commit and prune at the same time."""
        total = 0
        for parent, _, files in os.walk(self.dir):  # os.walk ignores vanished directories
            for name in files:
                if name.endswith(".snap"):
                    with contextlib.suppress(FileNotFoundError):
                        total += os.stat(os.path.join(parent, name)).st_size
        return total

    def report(self) -> dict:
        done = [r for r in self.results if r.committed]
        return {"every_steps": self.every_steps, "snapshots": len(done),
                "skipped": len(self.skipped), "bytes_per_snapshot": done[-1].bytes if done
                else 0, "blocked_s": round(sum(r.blocked_s for r in self.results), 6),
                "replica_peer": self.peer,
                "replicas_held": sum(r.replica_held for r in self.results),
                "held_bytes_on_node": self.held_bytes() if self._held_at_close is None
                else self._held_at_close}

    def close(self, *, discard: bool = False) -> None:
        """Wait for the snapshot in flight; `discard`: the segment ended cleanly, so its
        snapshots (and the replicas this node holds for others) are no longer needed."""
        try:
            self._harvest()
        finally:
            self._executor.shutdown(wait=True)
            self._stager.close()
        if discard:
            self._held_at_close = self.held_bytes()  # counted before local rank 0 deletes
            comm.barrier()
            if comm.local_rank() == 0:
                shutil.rmtree(self.dir, ignore_errors=True)


def _wait(works) -> None:
    for w in works:
        w.wait()
