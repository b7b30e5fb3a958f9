"""The model as the planner sees it: widths, depth, vocabulary, sequence length, MLP kind.

    from fm_pipeline.planner.shape import named_shape
    shape = named_shape("llama3-405b", seq_len=8192)
    shape.params().total, shape.model_flops_per_token()

Two families. Llama-style shapes (SwiGLU 3-matrix MLP, RMSNorm, RoPE, grouped-query
attention, flash attention) come from `fm_pipeline.model.registry` and count exactly what
the trainer builds, so planned and measured MFU share one numerator. GPT-style shapes
(2-matrix 4h GELU MLP, biases, LayerNorm, learned positions, tied embeddings, dropout, no
flash attention) reproduce the closed forms of Narayanan et al. 2021,
P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), and are what the published GPT-3,
MT-NLG and Megatron scaling runs trained.

Model FLOPs follow the PaLM convention used by the trainer (fm_pipeline/model/flops.py):
6 x parameters in matmuls + 12 x layers x hidden x seq_len for attention (full square,
forward and backward); the input embedding and learned positions are lookups.
"""

from __future__ import annotations

from dataclasses import dataclass

from fm_pipeline.planner.errors import PlanInputError, require_positive

MLP_KINDS = ("swiglu", "gelu")
NORM_KINDS = ("rmsnorm", "layernorm")


@dataclass(frozen=True)
class ParamBreakdown:
    embedding: int
    positions: int
    per_layer: int
    per_layer_norms: int  # replicated across tensor-parallel ranks
    layers: int
    final_norm: int
    output: int  # 0 when tied to the embedding
    routed: int = 0  # routed experts' weights over all MoE layers (not in per_layer / layers)
    routed_active: int = 0  # the top-k of them one token uses

    @property
    def total(self) -> int:
        return (self.embedding + self.positions + self.layers + self.final_norm + self.output
                + self.routed)

    @property
    def active(self) -> int:
        """What one token's forward uses: everything in a dense model; the router, the
        top-k routed experts and the shared ones in an MoE layer."""
        return self.total - self.routed + self.routed_active


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    mlp: str = "swiglu"
    bias: bool = False
    norm: str = "rmsnorm"
    learned_positions: bool = False
    tie_embeddings: bool = False
    dropout: bool = False
    flash_attention: bool = True
    name: str = "custom"
    # Mixture of Experts (0 experts: dense). `moe_layers` of the `layers` have a router,
    # `experts` routed experts of width `expert_ffn` (a token uses `top_k`) and
    # `shared_experts` always-on ones; the other layers keep the dense `ffn` MLP.
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    moe_layers: int = 0
    # Busiest expert-parallel rank's routed tokens / the mean (1: perfectly balanced). An
    # assumption unless measured: the trainer's router stats give the per-expert loads.
    expert_imbalance: float = 1.1
    # Node-limited routing (DeepSeek-V3's M = 4): a token's experts lie on at most this many
    # nodes and it crosses the network once per node, forwarded over NVLink there (DeepEP's
    # dispatch). 0: unlimited, every routed copy sent on its own (all_to_all_single, as the
    # trainer dispatches). Planner-only: the trainer's router does not limit nodes.
    route_nodes: int = 0
    # Attention head widths other than hidden / heads (planner-only, 0: hidden / heads):
    # DeepSeek-V3's multi-head latent attention scores with 192-wide query/key heads (128 +
    # 64 rotary) and 128-wide values, 2.9x the score FLOPs of the grouped-query stand-in's
    # 56-wide heads. Projections stay the stand-in's (its weights are within 1% of MLA's).
    qk_head_dim: int = 0
    v_head_dim: int = 0
    # An attention head's width when it is not hidden / heads (Qwen3: 64 heads of 128 in a
    # 4096-wide model): the query and output projections are heads x attn_head_dim wide.
    # The model builds it too (ModelConfig.attn_head_dim). 0: hidden / heads.
    attn_head_dim: int = 0

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len"):
            require_positive(field, getattr(self, field), integer=True)
        if not self.attn_head_dim and self.hidden % self.heads:
            raise PlanInputError(
                "heads", f"hidden ({self.hidden}) must be divisible by heads ({self.heads})"
            )
        if self.heads % self.kv_heads:
            raise PlanInputError(
                "kv_heads",
                f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})",
            )
        if self.mlp not in MLP_KINDS:
            raise PlanInputError("mlp", f"must be one of {', '.join(MLP_KINDS)}, got {self.mlp!r}")
        if self.experts:
            for field in ("top_k", "expert_ffn", "moe_layers"):
                require_positive(field, getattr(self, field), integer=True)
            if self.top_k > self.experts or self.moe_layers > self.layers:
                raise PlanInputError("top_k" if self.top_k > self.experts else "moe_layers",
                                     f"top_k ({self.top_k}) must not exceed experts "
                                     f"({self.experts}), nor moe_layers ({self.moe_layers}) "
                                     f"layers ({self.layers})")
            if self.expert_imbalance < 1:
                raise PlanInputError("expert_imbalance", "busiest rank / mean load is >= 1, "
                                     f"got {self.expert_imbalance}")
            if self.route_nodes < 0:
                raise PlanInputError("route_nodes", f"must be >= 0, got {self.route_nodes}")
        for field in ("qk_head_dim", "v_head_dim"):
            if getattr(self, field) < 0:
                raise PlanInputError(field, f"must be >= 0, got {getattr(self, field)}")
        if self.norm not in NORM_KINDS:
            raise PlanInputError(
                "norm", f"must be one of {', '.join(NORM_KINDS)}, got {self.norm!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """The queries' (and the attention output's) width: hidden unless attn_head_dim."""
        return self.heads * self.head_dim

    @property
    def score_dims(self) -> tuple[int, int]:
        """(query/key, value) widths of one attention head."""
        return (self.qk_head_dim or self.head_dim, self.v_head_dim or self.head_dim)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def moe_fraction(self) -> float:
        """Share of the layers that are MoE layers (per-layer costs are averaged over it)."""
        return self.moe_layers / self.layers

    @property
    def expert_weights(self) -> int:
        """One expert's matmul weights (SwiGLU: gate, up, down)."""
        return self.mlp_matrices * self.hidden * self.expert_ffn

    def _attention_weights(self) -> int:
        h = self.hidden
        return 2 * h * self.q_dim + 2 * h * self.kv_dim

    def _moe_layer_base(self) -> int:
        """An MoE layer's matmul weights outside the routed experts: attention, the router,
        the shared experts."""
        return (self._attention_weights() + self.hidden * self.experts
                + self.shared_experts * self.expert_weights)

    def layer_matmul_weights(self) -> float:
        """Matmul weights one token goes through in a layer (Q, K, V, O and the MLP; in an
        MoE model the mean over its layers, counting the router, the top-k routed experts
        and the shared ones)."""
        dense = self._attention_weights() + self.mlp_matrices * self.hidden * self.ffn
        if not self.experts:
            return dense
        moe = self._moe_layer_base() + self.top_k * self.expert_weights
        return (self.dense_layers * dense + self.moe_layers * moe) / self.layers

    def params(self) -> ParamBreakdown:
        h = self.hidden
        norm_size = h if self.norm == "rmsnorm" else 2 * h
        biases = (
            (self.q_dim + 2 * self.kv_dim + h + (self.mlp_matrices - 1) * self.ffn + h)
            if self.bias else 0
        )
        per_layer_norms = 2 * norm_size
        dense = self._attention_weights() + self.mlp_matrices * h * self.ffn
        dense_layer = dense + biases + per_layer_norms
        # per_layer: what every layer holds besides routed experts (their mean in an MoE
        # model); routed experts are counted apart because expert parallelism splits them.
        layers = self.dense_layers * dense_layer
        if self.experts:
            layers += self.moe_layers * (self._moe_layer_base() + per_layer_norms)
        routed = self.moe_layers * self.experts * self.expert_weights
        return ParamBreakdown(
            embedding=self.vocab * h,
            positions=self.seq_len * h if self.learned_positions else 0,
            per_layer=layers // self.layers,
            per_layer_norms=per_layer_norms,
            layers=layers,
            final_norm=norm_size,
            output=0 if self.tie_embeddings else self.vocab * h,
            routed=routed,
            routed_active=self.moe_layers * self.top_k * self.expert_weights,
        )

    def attention_flops_per_token(self) -> int:
        """QK^T and attention-over-V for one token, forward and backward, full square
        (12 x layers x hidden x seq_len when the heads are hidden / heads wide)."""
        qk, v = self.score_dims
        return 6 * self.layers * self.heads * (qk + v) * self.seq_len

    def model_flops_per_token(self) -> int:
        """Training FLOPs of one token, the MFU numerator (same convention as the trainer)."""
        p = self.params()
        matmul_params = p.active - p.embedding - p.positions  # MoE: the experts it is routed to
        if self.tie_embeddings:
            matmul_params += p.embedding  # the tied matrix still does the output projection
        return 6 * matmul_params + self.attention_flops_per_token()

    def describe(self) -> str:
        p = self.params()
        moe = ""
        if self.experts:
            moe = (f" ({p.active / 1e9:.1f}B active), {self.moe_layers} MoE layers of "
                   f"{self.experts} experts x {self.expert_ffn} top-{self.top_k}"
                   + (f" + {self.shared_experts} shared" if self.shared_experts else ""))
        return (
            f"{self.name}: {p.total / 1e9:.1f}B params{moe}, {self.layers} layers, hidden "
            f"{self.hidden}, {self.heads} heads ({self.kv_heads} kv), ffn {self.ffn} "
            f"{self.mlp}, vocab {self.vocab}, seq {self.seq_len}"
        )


def default_ffn(hidden: int, mlp: str) -> int:
    """4h for a GELU MLP; Llama's rule (2/3 of 4h, rounded up to 256) for SwiGLU."""
    if mlp == "gelu":
        return 4 * hidden
    return 256 * -(-int(8 * hidden / 3) // 256)


def gpt_shape(
    *, layers: int, hidden: int, heads: int, vocab: int, seq_len: int, name: str = "gpt"
) -> ModelShape:
    """A GPT-3 / Megatron-LM style decoder as trained in 2020-2022."""
    return ModelShape(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=heads,
        ffn=4 * hidden,
        vocab=vocab,
        seq_len=seq_len,
        mlp="gelu",
        bias=True,
        norm="layernorm",
        learned_positions=True,
        tie_embeddings=True,
        dropout=True,
        flash_attention=False,
        name=name,
    )


# Published GPT-style shapes: (layers, hidden, heads, vocab, seq_len).
GPT_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "gpt3-175b": (96, 12288, 96, 50257, 2048),  # Brown et al. 2020, Table 2.1
    "megatron-1.7b": (24, 2304, 24, 51200, 2048),  # Narayanan et al. 2021, Table 1
    "megatron-3.6b": (30, 3072, 32, 51200, 2048),
    "megatron-7.5b": (36, 4096, 32, 51200, 2048),
    "megatron-18.4b": (40, 6144, 48, 51200, 2048),
    "megatron-39.1b": (48, 8192, 64, 51200, 2048),
    "megatron-76.1b": (60, 10240, 80, 51200, 2048),
    "megatron-145.6b": (80, 12288, 96, 51200, 2048),
    "megatron-175b": (96, 12288, 96, 51200, 2048),  # GPT-3 shape, Megatron's padded vocab
    "megatron-310.1b": (96, 16384, 128, 51200, 2048),
    "megatron-529.6b": (105, 20480, 128, 51200, 2048),  # = MT-NLG 530B
    "megatron-1t": (128, 25600, 160, 51200, 2048),
    "megatron-22b": (48, 6144, 64, 51200, 2048),  # Korthikanti et al. 2022, Table 3
    # BigScience 2022 (ALiBi instead of learned positions: 0.03% of the parameters apart)
    "bloom-176b": (70, 14336, 112, 250880, 2048),
}


def shape_names() -> list[str]:
    from fm_pipeline.model.registry import model_names

    return [*model_names(), *GPT_SIZES]


def named_shape(name: str, *, seq_len: int | None = None) -> ModelShape:
    """A registry size (Llama-style) or a published GPT-style shape, by name."""
    if name in GPT_SIZES:
        layers, hidden, heads, vocab, default_seq = GPT_SIZES[name]
        return gpt_shape(
            layers=layers,
            hidden=hidden,
            heads=heads,
            vocab=vocab,
            seq_len=seq_len or default_seq,
            name=name,
        )
    from fm_pipeline.model.registry import get_model_config, model_names

    if name not in model_names():
        raise PlanInputError("model", f"unknown model {name!r}; known: {', '.join(shape_names())}")
    cfg = get_model_config(name)
    return shape_from_model_config(cfg, seq_len=seq_len or cfg.max_seq_len, name=name)


def shape_from_model_config(cfg, *, seq_len: int, name: str = "custom") -> ModelShape:
    """The planner's view of a `fm_pipeline.model.ModelConfig` trained at `seq_len`."""
    moe = {}
    if cfg.n_experts:
        moe = dict(experts=cfg.n_experts, top_k=cfg.moe_top_k, expert_ffn=cfg.expert_ffn_dim,
                   shared_experts=cfg.moe_shared_experts,
                   moe_layers=sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers)))
    return ModelShape(
        layers=cfg.n_layers,
        hidden=cfg.dim,
        heads=cfg.n_heads,
        kv_heads=cfg.n_kv_heads,
        ffn=cfg.ffn_dim,
        vocab=cfg.vocab_size,
        seq_len=seq_len,
        tie_embeddings=cfg.tie_embeddings,
        attn_head_dim=cfg.attn_head_dim,
        name=name,
        **moe,
    )
