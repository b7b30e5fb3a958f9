"""A parallel layout (tp, pp, dp, cp, micro-batch, interleaving, recomputation, sharding) and
a struct of arrays of many layouts, which the cost model evaluates in one vectorized pass.

    Layout(tp=8, pp=16, dp=128, micro_batch=1, virtual_stages=4, recompute="full")
    Layout(dp=256, ep=32, sharding="fsdp")  # MoE: experts split over 32 data-parallel ranks
    Layout(tp=2, pp=8, dp=16, ep=32)  # MoE, folded: ep over tp 2 x dp 16 (Megatron-Core)

Rules every layout obeys (checked one by one with the offending flag named, or as a mask
over thousands of candidates in `valid_mask`): the degrees multiply to the GPU count; tp
divides heads, kv_heads and ffn; tp x cp divides seq_len (sequence parallelism splits the
sequence over tp, context parallelism over cp); the global batch splits evenly into dp x
micro_batch; a pipeline has at least pp micro-batches (a multiple of pp when interleaved);
every pipeline chunk has at least one layer. Expert parallelism (ep) folds over the tensor-,
context- and data-parallel ranks of a pipeline stage, as Megatron-Core's MoE parallel folding
does with expert tensor parallelism 1 (its expert rank order etp-ep-edp-pp): ep consecutive
ranks of the stage split an MoE layer's experts and exchange tokens all-to-all (ep divides
experts and tp x cp x the shard group, so it needs sharding); the attention keeps tp and cp.
Experts are whole on their rank and FSDP/ZeRO-sharded over the tp x cp x shard group / ep
ranks that hold the same ones (the expert data-parallel group). With tp = cp = 1, as the
trainer runs MoE, ep is carved out of the shard group, as in torchtitan.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.shape import ModelShape

# "norm_act": the norms' outputs and the routed experts' SwiGLU recomputed from what is kept
# (Megatron-Core's --recompute-granularity selective --recompute-modules layernorm moe_act,
# its MoE recipes' default); "op": op-level selective checkpointing as the trainer runs it
# (its activation_checkpoint "selective": every matmul's and attention's output kept, the
# norms, RoPE and every SwiGLU's element-wise ops recomputed); "selective": Megatron's, the
# attention core recomputed (nothing to gain with flash attention); "half": full
# recomputation of every other layer (torchtitan's selective_ac_option "2", Megatron's
# --recompute-num-layers at half the stage). Ordered by how much is recomputed.
RECOMPUTE = ("none", "norm_act", "op", "selective", "half", "full")
SHARDING = ("ddp", "zero1", "zero2", "fsdp")
SCHEDULES = ("1F1B", "Interleaved1F1B", "GPipe")


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    micro_batch: int = 1
    virtual_stages: int = 1
    recompute: str = "none"
    sharding: str = "zero1"
    dp_shard: int = 0  # ranks an optimizer/FSDP shard group spans; 0: all of dp
    schedule: str = ""  # "": Interleaved1F1B when virtual_stages > 1, else 1F1B
    ep: int = 1  # expert-parallel degree, folded over tp x cp x the shard group

    @property
    def expert_fold(self) -> int:
        """Ranks of a pipeline stage that ep folds over: tp x cp x the shard group."""
        return self.tp * self.cp * self.shard_group

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def pipeline_schedule(self) -> str:
        return self.schedule or ("Interleaved1F1B" if self.virtual_stages > 1 else "1F1B")

    @property
    def shard_group(self) -> int:
        if self.sharding == "ddp":
            return 1
        return self.dp_shard or self.dp

    def describe(self) -> str:
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}"]
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        parts.append(f"mb={self.micro_batch}")
        if self.virtual_stages > 1:
            parts.append(f"v={self.virtual_stages}")
        if self.pipeline_schedule == "GPipe":
            parts.append("schedule=GPipe")
        hybrid = self.sharding != "ddp" and self.shard_group < self.dp
        parts += [f"recompute={self.recompute}",
                  f"{self.sharding}/{self.shard_group}" if hybrid else self.sharding]
        return " ".join(parts)


_DESCRIBED = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep", "mb": "micro_batch",
              "v": "virtual_stages"}


def parse_layout(text: str) -> Layout:
    """The inverse of `Layout.describe()`: "tp=8 pp=16 dp=16 mb=1 v=4 recompute=full fsdp/64"
    (what `fm plan search` prints) back into a Layout. Left out: tp, pp, dp, cp 1, mb 1,
    recompute none, sharding fsdp."""
    fields: dict = {"sharding": "fsdp"}
    for token in text.split():
        key, eq, value = token.partition("=")
        if not eq:
            sharding, slash, group = token.partition("/")
            if sharding not in SHARDING or (slash and not group.isdigit()):
                raise PlanInputError("layout", f"{token!r} is neither key=value nor a sharding "
                                     f"({', '.join(SHARDING)}, or fsdp/N for hybrid)")
            fields["sharding"], fields["dp_shard"] = sharding, int(group) if slash else 0
        elif key in _DESCRIBED:
            if not value.isdigit():
                raise PlanInputError("layout", f"{key} must be a whole number, got {value!r}")
            fields[_DESCRIBED[key]] = int(value)
        elif key in ("recompute", "schedule"):
            fields[key] = value
        else:
            raise PlanInputError("layout", f"unknown key {key!r}; known: "
                                 f"{', '.join([*_DESCRIBED, 'recompute', 'schedule'])}")
    return Layout(**fields)


def _check_ep(shape: ModelShape, layout: Layout) -> None:
    if layout.ep == 1:
        return
    if not shape.experts:
        raise PlanInputError("ep", f"ep {layout.ep} needs a Mixture of Experts model; "
                             f"{shape.name} is dense")
    if shape.experts % layout.ep:
        raise PlanInputError("ep", f"experts ({shape.experts}) must be divisible by ep "
                             f"({layout.ep})")
    if layout.sharding == "ddp":
        raise PlanInputError("ep", f"ep ({layout.ep}) needs sharding (zero1, zero2 or fsdp), "
                             "got ddp: the ranks that hold the same experts shard their state")
    if layout.expert_fold % layout.ep:
        raise PlanInputError("ep", f"ep ({layout.ep}) must divide tp x cp x the shard group "
                             f"({layout.tp} x {layout.cp} x {layout.shard_group} = "
                             f"{layout.expert_fold}): expert parallelism folds over a stage's "
                             "tensor-, context- and data-parallel ranks, the rest of them shard "
                             "each expert")


def microbatches(*, global_batch_tokens: int, seq_len: int, dp: int, micro_batch: int) -> int:
    return global_batch_tokens // seq_len // (dp * micro_batch)


def check_layout(shape: ModelShape, layout: Layout, *, gpus: int, global_batch_tokens: int) -> int:
    """Raise PlanInputError naming the flag at fault; return the micro-batches per step."""
    for name in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "virtual_stages"):
        value = getattr(layout, name)
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise PlanInputError(name, f"must be a whole number >= 1, got {value!r}")
    if layout.recompute not in RECOMPUTE:
        raise PlanInputError(
            "recompute", f"must be one of {', '.join(RECOMPUTE)}, got {layout.recompute!r}"
        )
    if layout.sharding not in SHARDING:
        raise PlanInputError(
            "sharding", f"must be one of {', '.join(SHARDING)}, got {layout.sharding!r}"
        )
    if layout.schedule and layout.schedule not in SCHEDULES:
        raise PlanInputError(
            "schedule", f"must be one of {', '.join(SCHEDULES)}, got {layout.schedule!r}"
        )
    if layout.gpus != gpus:
        raise PlanInputError(
            "dp",
            f"tp {layout.tp} x pp {layout.pp} x dp {layout.dp} x cp {layout.cp} = "
            f"{layout.gpus} must equal gpus ({gpus})",
        )
    for what, size in (("heads", shape.heads), ("kv_heads", shape.kv_heads), ("ffn", shape.ffn)):
        if size % layout.tp:
            raise PlanInputError("tp", f"tp ({layout.tp}) must divide {what} ({size})")
    if shape.seq_len % (layout.tp * layout.cp):
        field = "cp" if layout.cp > 1 else "tp"
        raise PlanInputError(
            field,
            f"tp x cp ({layout.tp} x {layout.cp}) must divide seq_len ({shape.seq_len}): "
            "sequence parallelism splits the sequence over tp, context parallelism over cp",
        )
    chunks = layout.pp * layout.virtual_stages
    if chunks > shape.layers:
        field = "virtual_stages" if layout.virtual_stages > 1 else "pp"
        raise PlanInputError(
            field,
            f"pp x virtual_stages ({layout.pp} x {layout.virtual_stages}) exceeds layers "
            f"({shape.layers}): every pipeline chunk needs a layer",
        )
    if layout.virtual_stages > 1 and layout.pp == 1:
        raise PlanInputError("virtual_stages", "interleaving (virtual_stages > 1) needs pp > 1")
    if layout.dp_shard and (layout.dp_shard < 1 or layout.dp % layout.dp_shard):
        raise PlanInputError("dp_shard", f"must divide dp ({layout.dp}), got {layout.dp_shard}")
    _check_ep(shape, layout)
    if global_batch_tokens % shape.seq_len:
        raise PlanInputError(
            "global_batch_tokens",
            f"{global_batch_tokens} is not a whole number of sequences of {shape.seq_len} tokens",
        )
    sequences = global_batch_tokens // shape.seq_len
    if sequences % (layout.dp * layout.micro_batch):
        raise PlanInputError(
            "micro_batch",
            f"the global batch of {sequences} sequences does not split into dp ({layout.dp}) x "
            f"micro_batch ({layout.micro_batch})",
        )
    m = sequences // (layout.dp * layout.micro_batch)
    if layout.pp > 1 and m < layout.pp:
        raise PlanInputError(
            "micro_batch",
            f"{m} micro-batches per step cannot fill a pipeline of pp={layout.pp} "
            "stages; lower micro_batch or dp, or raise the global batch",
        )
    if layout.pipeline_schedule == "Interleaved1F1B" and m % layout.pp:
        raise PlanInputError(
            "virtual_stages",
            f"the interleaved schedule needs micro-batches ({m}) divisible by pp ({layout.pp})",
        )
    return m


@dataclass
class Candidates:
    """Many layouts as parallel int arrays; categorical fields hold indices into the tuples
    RECOMPUTE, SHARDING and SCHEDULES."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    micro_batch: np.ndarray
    virtual_stages: np.ndarray
    recompute: np.ndarray
    sharding: np.ndarray
    dp_shard: np.ndarray  # resolved: 1 for ddp, the shard group size otherwise
    schedule: np.ndarray
    ep: np.ndarray

    def __len__(self) -> int:
        return len(self.tp)

    @classmethod
    def from_layouts(cls, layouts: list[Layout]) -> Candidates:
        def col(fn):
            return np.array([fn(lay) for lay in layouts], dtype=np.int64)

        return cls(
            tp=col(lambda x: x.tp),
            pp=col(lambda x: x.pp),
            dp=col(lambda x: x.dp),
            cp=col(lambda x: x.cp),
            micro_batch=col(lambda x: x.micro_batch),
            virtual_stages=col(lambda x: x.virtual_stages),
            recompute=col(lambda x: RECOMPUTE.index(x.recompute)),
            sharding=col(lambda x: SHARDING.index(x.sharding)),
            dp_shard=col(lambda x: x.shard_group),
            schedule=col(lambda x: SCHEDULES.index(x.pipeline_schedule)),
            ep=col(lambda x: x.ep),
        )

    def take(self, index) -> Candidates:
        return Candidates(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def layout(self, i: int) -> Layout:
        sharding = SHARDING[int(self.sharding[i])]
        dp = int(self.dp[i])
        shard = int(self.dp_shard[i])
        return Layout(
            tp=int(self.tp[i]),
            pp=int(self.pp[i]),
            dp=dp,
            cp=int(self.cp[i]),
            micro_batch=int(self.micro_batch[i]),
            virtual_stages=int(self.virtual_stages[i]),
            recompute=RECOMPUTE[int(self.recompute[i])],
            sharding=sharding,
            dp_shard=0 if sharding == "ddp" or shard == dp else shard,
            schedule=SCHEDULES[int(self.schedule[i])],
            ep=int(self.ep[i]),
        )


def valid_mask(shape: ModelShape, c: Candidates, *, global_batch_tokens: int) -> np.ndarray:
    """The vectorized form of `check_layout` (the GPU count is right by construction)."""
    sequences = global_batch_tokens // shape.seq_len
    ok = (shape.heads % c.tp == 0) & (shape.kv_heads % c.tp == 0) & (shape.ffn % c.tp == 0)
    ok &= shape.seq_len % (c.tp * c.cp) == 0
    ok &= c.pp * c.virtual_stages <= shape.layers
    ok &= (c.virtual_stages == 1) | (c.pp > 1)
    ok &= sequences % (c.dp * c.micro_batch) == 0
    m = sequences // np.maximum(c.dp * c.micro_batch, 1)
    ok &= (c.pp == 1) | (m >= c.pp)
    interleaved = c.schedule == SCHEDULES.index("Interleaved1F1B")
    ok &= ~interleaved | (m % c.pp == 0)
    if shape.experts:
        ddp = c.sharding == SHARDING.index("ddp")
        fold = c.tp * c.cp * c.dp_shard
        ok &= (shape.experts % c.ep == 0) & (fold % c.ep == 0) & (~ddp | (c.ep == 1))
    else:
        ok &= c.ep == 1
    return ok
