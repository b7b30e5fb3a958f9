"""Our checkpoints are plain DCP directories: torch's own tools read them.

    export_torch_save(ref, "model.pt")                  # = format_utils.dcp_to_torch_save
    full = load_full_state(ref, keys={"model"})         # unsharded tensors, one process

Both run in a single process, without a process group.
"""

from __future__ import annotations

from pathlib import Path

from fm_pipeline.catalog.refs import CheckpointRef
from fm_pipeline.catalog.validate import CheckpointInvalid, validate


def _local(ref: CheckpointRef | str | Path, *, verify: bool,
           cache_root: Path | None) -> CheckpointRef:
    if not isinstance(ref, CheckpointRef):
        ref = CheckpointRef.local(ref)
    if not ref.is_local:
        from fm_pipeline.checkpoint.load import localize

        ref, _ = localize(ref, cache_root=cache_root)  # one in the store: fetched here
    if verify and (problems := validate(ref)):
        raise CheckpointInvalid(ref, problems)
    return ref


def export_torch_save(ref: CheckpointRef | str | Path, out: str | Path, *,
                      verify: bool = True, cache_root: Path | None = None) -> Path:
    """The whole checkpoint as one `torch.save` file (nested dict, full tensors)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ref = _local(ref, verify=verify, cache_root=cache_root)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    dcp_to_torch_save(ref.dir, out)
    return out


def load_full_state(ref: CheckpointRef | str | Path, *, keys: set[str] | None = None,
                    verify: bool = True, cache_root: Path | None = None) -> dict:
    """Unsharded state (e.g. keys={"model"}) read straight from the files, no process group."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    ref = _local(ref, verify=verify, cache_root=cache_root)
    state: dict = {}
    # The same private planner dcp_to_torch_save uses; `keys` selects top-level parts.
    _load_state_dict(state, storage_reader=FileSystemReader(str(ref.dir)),
                     planner=_EmptyStateDictLoadPlanner(keys=keys), no_dist=True)
    return state
