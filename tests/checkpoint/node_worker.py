"""torchrun worker for the multi-node test: each node has its own FM_HOME (its own local
checkpoint tier, like a node's own disk) and all share one object store.

    FM_HOME=A torchrun --nnodes 2 ... -m tests.checkpoint.node_worker save OUT STORE_URI
    FM_HOME=B torchrun --nnodes 2 ... -m tests.checkpoint.node_worker save OUT STORE_URI

`save`: FSDP2 over both nodes, async saves at steps 1 and 3, uploaded. `resume`: restore the
newest checkpoint (fetching what this node's disk lacks from the store), train step 4 and
save it. Rank 0 dumps the gathered state; every rank writes what its node's disk holds.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from tests.local_site import local_root
from fm_pipeline.checkpoint import CheckpointManager
from tests.checkpoint.dist_worker import build, dump, train_and_save
from tests import local_site


def main(mode: str, out: Path, store_uri: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    job, mesh, trainer = build(world, nnodes=world, upload=True)
    site = local_site.site()  # this worker's entry point: its node's FM_HOME, the S3 service
    manager = CheckpointManager(job, trainer.app_state, mesh=mesh,
                                store=site.open_store(store_uri), async_save=True, site=site)
    report = {"rank": rank, "fm_home": os.environ["FM_HOME"], "copies": manager.copies.count}
    if mode == "save":
        result = train_and_save(trainer, manager, rank)
        assert result.upload.committed, result
        dump(trainer, out / "source.pt")
    else:
        restored = manager.restore_latest()
        assert restored is not None and restored.step == 3, restored
        report["download_s"] = restored.download_s
        dump(trainer, out / "resumed.pt")
        trainer.step(4, rank)
        manager.save(4, tokens_seen=4 * 32, final=True)
        result = manager.close()
        assert result.committed and result.upload.committed, result
    root = local_root(job.name)
    report["files"] = {p.name: sorted(f.name for f in p.iterdir() if f.is_file())
                       for p in sorted(root.iterdir()) if p.is_dir()}
    (out / f"{mode}-rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
