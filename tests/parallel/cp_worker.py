"""torchrun worker for test_context_parallel_cpu: torch's own context parallelism
(torch.distributed.tensor.experimental.context_parallel, ring attention over a "cp" mesh
dimension) on 2 gloo ranks, as the trainer would run it: the input's sequence sharded with
torch's load balancer, causal attention inside the context, a backward. Writes what torch
did to $OUT/cp-rank<r>.json: {"ran": true, "max_err": ...} against full attention, or
{"ran": false, "error": "<type>: <message>"}."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh


def attention(proj: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    b, s, _ = x.shape
    q, k, v = proj(x).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def main(out_dir: str) -> None:
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    proj = torch.nn.Linear(16, 48)
    x = torch.randn(1, 16, 16)
    full = attention(proj, x)
    shard = x.clone()
    try:
        with context_parallel(mesh, buffers=[shard], buffer_seq_dims=[1]):
            out = attention(proj, shard)
            out.sum().backward()
        (whole,) = context_parallel_unshard(mesh, [out.detach()], [2])
        result = {"ran": True, "max_err": float((whole - full.detach()).abs().max())}
    except Exception as e:  # what torch says, recorded for the test to read
        result = {"ran": False, "error": f"{type(e).__name__}: {e}"[:1000]}
    Path(out_dir, f"cp-rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
