"""Published large training runs: configurations and measured throughput, transcribed from
the papers' tables, for calibrating the cost model (docs/calibration-planner.md).

Each row pins what the paper publishes (model, GPUs, tp, pp, dp, cp, batch, and micro-batch,
interleaving, recomputation or sharding where stated). Whatever a paper leaves out, the
planner's own search chooses, with the published degrees pinned: the same rule for every
row, no per-row constants.

Sources
- [NAR21] Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", SC 2021, arXiv:2104.04473. Table 1 (weak scaling, A100 80GB, 8x200 Gb/s
  HDR InfiniBand per node, full recomputation, interleaved schedule) and Table 2 (PTD-P
  strong scaling, micro-batch 1). Metric: teraFLOP/s per GPU by their eq. (3),
  F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration.
- [KOR22] Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", MLSys 2023, arXiv:2205.05198. Tables 3 and 5 (A100 80GB, no data parallelism,
  interleaving with 3 stages for 175B and 530B), iteration time with full recomputation and
  with sequence parallelism + selective recomputation; section 6.3 for 530B at dp=8 (no
  overlap of gradient all-reduce).
- [MTNLG22] Smith et al., "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B",
  arXiv:2201.11990, section 2.4: batch 1920 on 280/350/420 DGX A100 nodes, 60.1/50.2/44.4 s
  per iteration (126/121/113 TFLOP/s per GPU), tp=8, pp=35.
- [LLAMA3] Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 4 (H100 80GB,
  400 Gb/s RoCE per GPU, BF16 MFU of the 405B pre-training stages); rows checked against
  P. Balaji's SC'24 slide of the same table (see docs/calibration-planner.md).
- [DGXC24] NVIDIA DGX Cloud Benchmarking, Llama 3.1 recipes for NeMo 24.09
  (github.com/NVIDIA/dgxc-benchmarking, llama3.1/README_8b.md, README_70b.md,
  README_405b.md): DGX H100 (8 x H100 SXM 80GB, 8 x 400 Gb/s InfiniBand per node), seconds
  per step of the same layout in BF16 and in FP8 (Transformer Engine, per-tensor scales),
  weak-scaled from the smallest full-model size to the largest.
- [TITAN24/25] torchtitan's H100 benchmarks (github.com/pytorch/torchtitan, benchmarks/
  llama3_h100_202412_torchtitan.md Tables 1 and 3; asyncTP_llama3_h100_2025-06_torchtitan.md,
  vanilla TP columns): tokens/s per GPU of the same layout with and without torchao Float8
  (tensorwise; rowwise in 2025), on Grand Teton H100s (96 GB HBM2e, 2.4 TB/s, capped at
  500 W). Compared as the FP8 / BF16 throughput ratio, which the unknown power-capped peak
  cancels out of.
- [TOTALS] Whole training runs' published GPU-hours (production: failures, restarts,
  evaluation and every phase included). Llama 3.1 405B: 30.84M H100-hours (Meta's model
  card, meta-llama/llama-models models/llama3_1/MODEL_CARD.md) for ~15.6T tokens, on the
  Table 4 layouts; Llama 3 70B: 6.4M H100-hours for 15T tokens (Meta's Llama 3 model card;
  the layout and GPU count are not published: 4,096 GPUs assumed, the search choosing the
  rest, as the issue that asked for this row framed it); BLOOM 176B: 1,082,990 A100-hours
  for 366B tokens on 384 A100 80GB, tp 4 x pp 12 x dp 8 ZeRO-1, batch 2,048 x 2,048 tokens,
  four 100 Gb/s Omni-Path links per 8-GPU node (BigScience, arXiv:2211.05100 and its model
  card; GENCI's report of the run). GPT-3's training time was never published.
- [MBRIDGE25] NVIDIA Megatron-Bridge, docs/performance-summary.md, 25.09 container, DGX-H100
  table: DeepSeek-V3 (dropless, routing force-balanced) on 1,024 H100, global batch 8,192 x
  4,096 tokens, micro-batch 1, tp 2, pp 8, vp 4, ep 64: 1,297 tokens/s per GPU in FP8 current
  scaling (per-tensor). Its recipe (scripts/performance, deepseek_v3 H100 config): DeepEP
  dispatch (once per node), the all-to-all overlapped across micro-batches, MLA's up
  projections and the MLP recomputed.
- [MOEZOO25] NVIDIA Megatron-MoE-ModelZoo, best_practice/Qwen3/readme.md and
  run_h100_235b.sh: Qwen3-235B-A22B on 256 H100 (NVLink 4, 8 x 50 GB/s InfiniBand per
  node), BF16, sequence 4,096, global batch 2,048, expert tp 1; DeepEP, tp 2 x pp 8 (vp 4)
  x ep 32, micro-batch 1, norms and the experts' activation recomputed, routing
  force-balanced: 19.7 s a step, 17.6 s with the 1F1B all-to-all overlap; tp 4 x pp 8 (vp
  4) x ep 8, no recomputation: 29.0 s; tp 2 x ep 8 x FSDP over dp 128, micro-batch 4, full
  recomputation: 17.6 s; the all-to-all dispatcher, tp 2 x pp 32 (vp 3) x ep 8: 24.2 s.
  best_practice/Mixtral/run_mixtral_8x22B.sh with runtime_configs/benchmarking/runtime.conf
  and model_configs/benchmarking/Mixtral-8x22B.yaml: Mixtral 8x22B (Llama 2's 32,000-token
  vocabulary) on 128 H100, BF16, tp 2 x pp 8 x ep 8, micro-batch 1, global batch 256 x
  4,096 tokens, the all-to-all dispatcher, dropless with the auxiliary loss, no
  recomputation, expandable segments: "around 455 TFLOPS" per GPU by Megatron's FLOP count
  of the time (training.py num_floating_point_operations, the whole attention matrix).
- [DSV3] DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437: 2,048 H800 (NVLink
  160 GB/s measured, 8 x 400 Gb/s InfiniBand per node), pp 16 (DualPipe), ep 64 over 8
  nodes, ZeRO-1 data parallelism, no tp; FP8 GEMMs with 1x128 / 128x128 scales; tokens
  routed to at most 4 nodes; batch up to 15,360 x 4,096 tokens; 2.664M H800 GPU-hours of
  pre-training for 14.8T tokens (Table 1; 180K GPU-hours per trillion tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PublishedRun:
    key: str
    source: str
    model: str  # a name for fm_pipeline.planner.shape.named_shape
    seq_len: int
    gpu_type: str
    gpus: int
    tp: int
    pp: int
    dp: int
    global_batch: int  # sequences
    metric: str  # "tflops_eq3" (per GPU, NAR21 eq. 3), "iteration_s", "mfu", "fp8_speedup",
    #              "gpu_hours" (compute hours of a whole training budget), "memory_gib"
    #              (peak memory per GPU; every layout field pinned) or "tokens_per_s_gpu"
    value: float
    cp: int = 1
    pinned: dict = field(default_factory=dict)  # micro_batch, virtual_stages, recompute, sharding
    dp_overlap: bool = True  # overlap of data-parallel communication with compute
    sequence_parallel: bool = True  # False: Megatron before 2022 (tp all-reduces, unsplit norms)
    tp_overlap: bool = True  # False: tensor-parallel traffic not overlapped (before 2023)
    inter_node_gbps: float | None = None
    precision: str = "bf16"  # fm_pipeline.planner.precision; "fp8_speedup" rows: the FP8 one
    training_tokens: float = 0.0  # "gpu_hours" rows: the budget the hours trained
    ep_overlap: str = "none"  # the all-to-all's overlap: "none", "1f1b" (Megatron-Core's), "dualpipe"
    shape_overrides: dict = field(default_factory=dict)  # e.g. node-limited routing
    # Why the command line cannot state the published run ("" = it can): such a row is
    # predicted with the nearest setting and reported apart (benchmarks.planner_fidelity).
    not_expressible: str = ""

    @property
    def tuning(self) -> bool:
        """The rows the chosen constants (compute.K_HALF, ELEMENTWISE_PASSES; step's
        EP_OVERLAP_1F1B) were picked on; every other row is validation."""
        return self.source.startswith("KOR22") or self.key in MOEZOO25_OVERLAP_PAIR

    @property
    def production(self) -> bool:
        """A production run's throughput or total (data pipeline, checkpoints, evaluation,
        failures included), not a benchmark: reported, not held to the benchmark error
        bounds. Its GPU-hours are predicted with the planner's goodput (failures, saves)."""
        return self.source.startswith(("MTNLG22", "TOTALS"))


A100_HDR = 25.0  # 200 Gb/s HDR InfiniBand per GPU on Selene / DGX A100
MEGATRON_2021 = {"recompute": "full", "sharding": "ddp"}


def _a100(key: str, source: str, model: str, *, gpus: int, tp: int, pp: int, batch: int,
          metric: str, value: float, sequence_parallel: bool = False, **pinned) -> PublishedRun:
    """A Megatron run on Selene-like A100 80GB nodes (2021-2022: no overlap of DP comm)."""
    return PublishedRun(key=key, source=source, model=f"megatron-{model}", seq_len=2048,
                        gpu_type="a100-80gb", gpus=gpus, tp=tp, pp=pp, dp=gpus // (tp * pp),
                        global_batch=batch, metric=metric, value=value, pinned=pinned,
                        dp_overlap=False, inter_node_gbps=A100_HDR,
                        sequence_parallel=sequence_parallel, tp_overlap=False)


# NAR21 Table 1: model, tp, pp, GPUs, batch, teraFLOP/s per GPU.
NAR21_TABLE_1 = [
    ("1.7b", 1, 1, 32, 512, 137), ("3.6b", 2, 1, 64, 512, 138),
    ("7.5b", 4, 1, 128, 512, 142), ("18.4b", 8, 1, 256, 1024, 135),
    ("39.1b", 8, 2, 512, 1536, 138), ("76.1b", 8, 4, 1024, 1792, 140),
    ("145.6b", 8, 8, 1536, 2304, 148), ("310.1b", 8, 16, 1920, 2160, 155),
    ("529.6b", 8, 35, 2520, 2520, 163), ("1t", 8, 64, 3072, 3072, 163),
]
# NAR21 Table 2, PTD-P rows (tp=8, micro-batch 1): model, pp, batch, GPUs, teraFLOP/s per GPU.
NAR21_TABLE_2 = [
    ("175b", 12, 1536, 384, 153), ("175b", 12, 1536, 768, 149), ("175b", 12, 1536, 1536, 141),
    ("529.6b", 35, 2240, 560, 171), ("529.6b", 35, 2240, 1120, 167),
    ("529.6b", 35, 2240, 2240, 159),
]
# KOR22 Tables 3 and 5 (tp=8, dp=1): model, pp, GPUs = batch, micro-batch, interleaving,
# recomputation, seconds per iteration ("full" rows: full recomputation, no sequence parallel).
KOR22_TABLE_5 = [
    ("22b", 1, 8, 4, 1, "full", 1.42), ("22b", 1, 8, 4, 1, "selective", 1.10),
    ("175b", 8, 64, 1, 3, "full", 18.13), ("175b", 8, 64, 1, 3, "selective", 13.75),
    ("529.6b", 35, 280, 1, 3, "full", 49.05), ("529.6b", 35, 280, 1, 3, "selective", 37.83),
    ("1t", 64, 512, 1, 1, "full", 94.42), ("1t", 64, 512, 1, 1, "selective", 71.49),
]
KOR22_BATCH = {"22b": 4, "175b": 64, "529.6b": 280, "1t": 512}
# MTNLG22 section 2.4 (tp=8, pp=35, batch 1920): GPUs, seconds per iteration.
MTNLG22 = [(2240, 60.1), (2800, 50.2), (3360, 44.4)]
# LLAMA3 Table 4 (405B, tp=8, pp=16, 16M tokens per step): GPUs, cp, dp, sequence, BF16 MFU.
LLAMA3_TABLE_4 = [(8192, 1, 64, 8192, 0.43), (16384, 1, 128, 8192, 0.41),
                  (16384, 16, 8, 131072, 0.38)]

PUBLISHED_RUNS: list[PublishedRun] = [
    *[_a100(f"nar21-t1-{m}", "NAR21 Table 1", m, gpus=g, tp=tp, pp=pp, batch=b,
            metric="tflops_eq3", value=x, **MEGATRON_2021)
      for m, tp, pp, g, b, x in NAR21_TABLE_1],
    *[_a100(f"nar21-t2-{m}-{g}", "NAR21 Table 2 (PTD-P)", m, gpus=g, tp=8, pp=pp, batch=b,
            metric="tflops_eq3", value=x, micro_batch=1, **MEGATRON_2021)
      for m, pp, b, g, x in NAR21_TABLE_2],
    *[_a100(f"kor22-{m}-{rec}", "KOR22 Tables 3, 5", m, gpus=g, tp=8, pp=pp, batch=KOR22_BATCH[m],
            metric="iteration_s", value=x, micro_batch=mb, virtual_stages=v, recompute=rec,
            sharding="ddp", sequence_parallel=rec == "selective")
      for m, pp, g, mb, v, rec, x in KOR22_TABLE_5],
    _a100("kor22-529.6b-dp8", "KOR22 section 6.3", "529.6b", gpus=2240, tp=8, pp=35, batch=2240,
          metric="iteration_s", value=39.15, micro_batch=1, virtual_stages=3,
          recompute="selective", sharding="ddp", sequence_parallel=True),
    *[_a100(f"mtnlg22-{g}", "MTNLG22 section 2.4", "529.6b", gpus=g, tp=8, pp=35, batch=1920,
            metric="iteration_s", value=x, micro_batch=1, **MEGATRON_2021)
      for g, x in MTNLG22],
    *[PublishedRun(key=f"llama3-405b-{g}-{seq}", source="LLAMA3 Table 4", model="llama3-405b",
                   seq_len=seq, gpu_type="h100-sxm", gpus=g, tp=8, pp=16, dp=dp, cp=cp,
                   global_batch=16 * 2**20 // seq, metric="mfu", value=mfu,
                   pinned={"micro_batch": 1}, inter_node_gbps=50.0)
      for g, cp, dp, seq, mfu in LLAMA3_TABLE_4],
]

# DGXC24 (NeMo 24.09, DGX H100, seq 8192, micro-batch 1): model, tp, pp, cp, virtual stages,
# sequences per GPU-count step as (GPUs, batch), seconds per step in BF16 and in FP8.
DGXC24 = [
    ("llama3-8b", 1, 1, 2, 1, [(8, 128, 12.91, 9.67), (128, 2048, 13.10, 9.82)]),
    ("llama3-70b", 4, 4, 2, 5, [(64, 128, 14.72, 11.01), (2048, 4096, 14.98, 11.39)]),
    ("llama3-405b", 8, 9, 2, 7, [(576, 252, 17.20, 11.24), (2304, 1008, 17.62, 12.35)]),
]
# TITAN24/25 (seq 8192, torch.compile): key, model, GPUs, tp, sequences per data-parallel
# rank (one micro-batch), full recomputation or not, recipe, FP8 over BF16 tokens/s. The 8B
# rows use torchtitan's per-op selective checkpointing (every other matmul output kept),
# which the cost model does not have (its "op", the trainer's, keeps every matmul output):
# calibration's search picks the recomputation for them, benchmarks.planner_fidelity keeps
# the command's default (none).
TITAN_FP8 = [
    ("titan24-8b-8", "llama3-8b", 8, 1, 2, False, "fp8-tensorwise", 8532 / 6667),
    ("titan24-8b-128", "llama3-8b", 128, 1, 2, False, "fp8-tensorwise", 8380 / 6514),
    ("titan25-70b-256", "llama3-70b", 256, 8, 16, True, "fp8-tensorwise", 809.8 / 597.3),
    ("titan25-70b-256-rowwise", "llama3-70b", 256, 8, 16, True, "fp8-rowwise", 599.6 / 597.3),
    ("titan25-8b-64", "llama3-8b", 64, 8, 12, False, "fp8-tensorwise", 5078.1 / 4378),
    ("titan25-8b-64-rowwise", "llama3-8b", 64, 8, 12, False, "fp8-rowwise", 3708.5 / 4378),
]

PUBLISHED_RUNS += [
    *[PublishedRun(key=f"dgxc24-{m.split('-')[1]}-{g}-{prec}", source="DGXC24 (NeMo 24.09)",
                   model=m, seq_len=8192, gpu_type="h100-sxm", gpus=g, tp=tp, pp=pp,
                   dp=g // (tp * pp * cp), cp=cp, global_batch=b, metric="iteration_s",
                   value=secs, pinned={"micro_batch": 1, "virtual_stages": v},
                   inter_node_gbps=50.0, precision=prec)
      for m, tp, pp, cp, v, sizes in DGXC24
      for g, b, bf16_s, fp8_s in sizes
      for prec, secs in (("bf16", bf16_s), ("fp8-tensorwise", fp8_s))],
    *[PublishedRun(key=key, source="TITAN24/25 (torchtitan)", model=m, seq_len=8192,
                   gpu_type="h100-96gb", gpus=g, tp=tp, pp=1, dp=g // tp,
                   global_batch=g // tp * local, metric="fp8_speedup", value=ratio,
                   pinned={"micro_batch": local, "sharding": "fsdp",
                           **({"recompute": "full"} if full_ac else {})},
                   inter_node_gbps=50.0, precision=prec)
      for key, m, g, tp, local, full_ac, prec, ratio in TITAN_FP8],
]

# DSV3: the planner's deepseek-v3-like (grouped-query projections standing in for MLA's,
# MLA's 192 / 128-wide heads for the scores, no multi-token-prediction module) with the
# published system around it; the batch is the final 15,360 sequences (the first 469B
# tokens ramp up from 3,072). Tokens reach at most 4 nodes (the model's group-limited
# routing), sent once per node by the dispatch.
DSV3_SYSTEM = {"route_nodes": 4, "qk_head_dim": 192, "v_head_dim": 128}
PUBLISHED_RUNS.append(PublishedRun(
    key="dsv3-2048-h800", source="DSV3 Table 1", model="deepseek-v3-like", seq_len=4096,
    gpu_type="h800", gpus=2048, tp=1, pp=16, dp=128, global_batch=15360, metric="gpu_hours",
    value=2.664e6, pinned={"ep": 64, "sharding": "zero1", "micro_batch": 1},
    inter_node_gbps=50.0, precision="fp8-blockwise", training_tokens=14.8e12,
    ep_overlap="dualpipe", shape_overrides=DSV3_SYSTEM))

# TITAN24 memory (GiB per GPU, torchtitan's logged peak reserved by the caching allocator,
# the fullest rank; torch.compile + Float8 tensorwise, full activation checkpointing):
# key, model, seq_len, GPUs, tp, pp, cp, sequences per data-parallel rank, GiB.
TITAN24_MEMORY = [
    ("titan24-mem-70b-2d", "llama3-70b", 8192, 256, 8, 1, 1, 16, 71.9),  # Table 4
    ("titan24-mem-405b-1f1b", "llama3-405b", 8192, 512, 8, 8, 1, 32, 82.5),  # Table 5
    *[(f"titan24-mem-405b-cp{cp}", "llama3-405b", 32768 * cp, 512, 8, 8, cp, 8, gib)
      for cp, gib in ((1, 75.3), (2, 75.9), (4, 77.1), (8, 84.9))],  # Table 6
    *[(f"titan24-mem-8b-cp{cp}", "llama3-8b", 32768 * cp, 8, 1, 1, cp, 1, gib)
      for cp, gib in ((1, 83.9), (2, 84.2), (4, 84.0), (8, 84.5))],  # Table 2
]
PUBLISHED_RUNS += [
    PublishedRun(key=key, source="TITAN24 memory (torchtitan)", model=m, seq_len=seq,
                 gpu_type="h100-96gb", gpus=g, tp=tp, pp=pp, cp=cp, dp=g // (tp * pp * cp),
                 global_batch=g // (tp * pp * cp) * local, metric="memory_gib", value=gib,
                 # pipeline micro-batches of one sequence (torchtitan's default), 1F1B
                 pinned={"micro_batch": 1 if pp > 1 else local, "virtual_stages": 1,
                         "recompute": "full", "sharding": "fsdp"},
                 inter_node_gbps=50.0, precision="fp8-tensorwise")
    for key, m, seq, g, tp, pp, cp, local, gib in TITAN24_MEMORY
]

# TITAN24 throughput (torchtitan's BF16 FSDP2 runs, tokens/s per GPU, seq 8192, no
# torch.compile, one micro-batch per rank): benchmarks/llama3_h100_202412_torchtitan.md
# Table 1 (8B on 8 Grand Teton H100, local batch 2); docs/performance.md (405B on 128 H100,
# FSDP 16 x TP 8, local batch 2, full AC: 109 tok/s, 29.0% MFU; 8B and 70B on 64 A100 80GB,
# local batch 1: 2,904 with per-layer selective AC, 331 with full AC). torchtitan's
# "selective layer" AC checkpoints every other block (its option "2": the planner's "half",
# an assumption about the option the run used); its per-op AC (Table 1) has no equivalent.
TITAN_OP_AC = ("torchtitan's per-op selective activation checkpointing (every other "
               "matmul's output kept) has no --recompute setting")
TITAN24_THROUGHPUT = [  # key, model, GPU, GPUs, tp, local batch, recompute, tok/s/GPU, why not
    ("titan24-tps-8b-8", "llama3-8b", "h100-96gb", 8, 1, 2, None, 5762, TITAN_OP_AC),
    ("titan24-tps-405b-128", "llama3-405b", "h100-96gb", 128, 8, 2, "full", 109, ""),
    ("titan24-tps-8b-64-a100", "llama3-8b", "a100-80gb", 64, 1, 1, "half", 2904, ""),
    ("titan24-tps-70b-64-a100", "llama3-70b", "a100-80gb", 64, 1, 1, "full", 331, ""),
]
PUBLISHED_RUNS += [
    PublishedRun(key=key, source="TITAN24 throughput (torchtitan)", model=m, seq_len=8192,
                 gpu_type=gpu, gpus=g, tp=tp, pp=1, dp=g // tp, global_batch=g // tp * local,
                 metric="tokens_per_s_gpu", value=tps,
                 pinned={"micro_batch": local, "sharding": "fsdp",
                         **({"recompute": rec} if rec else {})},
                 inter_node_gbps=50.0 if gpu == "h100-96gb" else None, not_expressible=why)
    for key, m, gpu, g, tp, local, rec, tps, why in TITAN24_THROUGHPUT
]

# TOTALS: GPU-hours of whole production runs (see the module docstring).
PUBLISHED_RUNS += [
    PublishedRun(key="totals-llama3.1-405b", source="TOTALS Llama 3.1 model card",
                 model="llama3-405b", seq_len=8192, gpu_type="h100-sxm", gpus=16384, tp=8,
                 pp=16, dp=128, global_batch=2048, metric="gpu_hours", value=30.84e6,
                 pinned={"micro_batch": 1}, inter_node_gbps=50.0, training_tokens=15.6e12),
    PublishedRun(key="totals-llama3-70b", source="TOTALS Llama 3 model card",
                 model="llama3-70b", seq_len=8192, gpu_type="h100-sxm", gpus=4096, tp=0, pp=0,
                 dp=0, global_batch=2048, metric="gpu_hours", value=6.4e6,
                 inter_node_gbps=50.0, training_tokens=15e12),
    PublishedRun(key="totals-bloom-176b", source="TOTALS BLOOM", model="bloom-176b",
                 seq_len=2048, gpu_type="a100-80gb", gpus=384, tp=4, pp=12, dp=8,
                 global_batch=2048, metric="gpu_hours", value=1_082_990,
                 pinned={"sharding": "zero1"}, inter_node_gbps=6.25, training_tokens=366e9,
                 sequence_parallel=False, tp_overlap=False),  # Megatron-DeepSpeed, 2022
]

# MBRIDGE25: DeepSeek-V3 on 1,024 H100 with Megatron-Core's MoE system (see the docstring).
PUBLISHED_RUNS.append(PublishedRun(
    key="mbridge25-dsv3-1024-h100", source="MBRIDGE25 (Megatron-Bridge 25.09)",
    model="deepseek-v3-like", seq_len=4096, gpu_type="h100-sxm", gpus=1024, tp=2, pp=8, dp=64,
    global_batch=8192, metric="iteration_s", value=8192 * 4096 / (1024 * 1297),
    pinned={"ep": 64, "sharding": "zero1", "micro_batch": 1, "virtual_stages": 4},
    inter_node_gbps=50.0, precision="fp8-tensorwise", ep_overlap="1f1b",
    shape_overrides={**DSV3_SYSTEM, "expert_imbalance": 1.0}))

# MOEZOO25: Qwen3-235B-A22B (exact shape) on 256 H100, BF16, 2,048 x 4,096-token batches,
# routing force-balanced; expert tp 1, ep folded over tp x dp (layout.py). DeepEP sends a
# token once per node it reaches (route_nodes as large as the ep group's nodes). The pair
# with and without the 1F1B all-to-all overlap is what step.EP_OVERLAP_1F1B is fitted on.
# The fourth published layout (tp 2, pp 32, vp 3: 96 pipeline chunks for 94 layers, the
# embedding and the loss counted as layers) is not a layout the planner can state.
MOEZOO25_OVERLAP_PAIR = ("moezoo25-qwen3-235b-256-h100", "moezoo25-qwen3-235b-256-h100-overlap")
MOEZOO25_SYSTEM = {"expert_imbalance": 1.0, "route_nodes": 32}
_INTERLEAVED_NORM_ACT = {"sharding": "zero1", "micro_batch": 1, "virtual_stages": 4}
PUBLISHED_RUNS += [
    PublishedRun(key=key, source="MOEZOO25 (Megatron-MoE-ModelZoo)", model="qwen3-235b-a22b",
                 seq_len=4096, gpu_type="h100-sxm", gpus=256, tp=tp, pp=pp, dp=256 // (tp * pp),
                 global_batch=2048, metric="iteration_s", value=seconds,
                 pinned={"ep": ep, **pinned}, inter_node_gbps=50.0, ep_overlap=overlap,
                 shape_overrides=MOEZOO25_SYSTEM)
    for key, tp, pp, ep, pinned, overlap, seconds in (
        (MOEZOO25_OVERLAP_PAIR[0], 2, 8, 32, {**_INTERLEAVED_NORM_ACT, "recompute": "norm_act"},
         "none", 19.7),
        (MOEZOO25_OVERLAP_PAIR[1], 2, 8, 32, {**_INTERLEAVED_NORM_ACT, "recompute": "norm_act"},
         "1f1b", 17.6),
        ("moezoo25-qwen3-235b-256-h100-tp4", 4, 8, 8, {**_INTERLEAVED_NORM_ACT,
                                                       "recompute": "none"}, "none", 29.0),
        ("moezoo25-qwen3-235b-256-h100-fsdp", 2, 1, 8, {"sharding": "fsdp", "dp_shard": 0,
                                                        "micro_batch": 4, "recompute": "full"},
         "none", 17.6),
    )
]


def megatron_step_s(tflops_per_gpu: float, *, gpus: int, sequences: int, seq_len: int,
                    layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, top_k: int,
                    vocab: int, head_dim: int = 0, causal: bool = False) -> float:
    """The step time behind a TFLOP/s per GPU that Megatron-LM logged: training.py's
    num_floating_point_operations, 12 B s L h^2 ((1 + g/a + s/h) q + ffn/h top_k 3/2 +
    V / (2 L h)) for SwiGLU with q = heads x head_dim / h; `causal` halves the s/h term, as
    Megatron has counted since 2025 (before, the whole attention matrix)."""
    q = heads * (head_dim or hidden // heads) / hidden
    scores = seq_len / hidden * (0.5 if causal else 1.0)
    per_seq = 12 * seq_len * layers * hidden * hidden * (
        (1 + kv_heads / heads + scores) * q + ffn / hidden * top_k * 1.5
        + vocab / (2 * layers * hidden))
    return sequences * per_seq / (tflops_per_gpu * 1e12 * gpus)


# MOEZOO25's Mixtral 8x22B, its 455 TFLOP/s as a step time (4.51 s).
PUBLISHED_RUNS.append(PublishedRun(
    key="moezoo25-mixtral-8x22b-128-h100", source="MOEZOO25 (Megatron-MoE-ModelZoo)",
    model="mixtral-8x22b", seq_len=4096, gpu_type="h100-sxm", gpus=128, tp=2, pp=8, dp=8,
    global_batch=256, metric="iteration_s",
    value=megatron_step_s(455, gpus=128, sequences=256, seq_len=4096, layers=56, hidden=6144,
                          heads=48, kv_heads=8, ffn=16384, top_k=2, vocab=32000),
    pinned={"ep": 8, "sharding": "zero1", "micro_batch": 1, "virtual_stages": 1,
            "recompute": "none"},
    inter_node_gbps=50.0, shape_overrides={"vocab": 32000}))
