"""Named model sizes, from test sizes that train in seconds on a CPU to real Llama 3 shapes.

The tiny sizes take their vocabulary from the job's tokenizer (the job spec sets
`vocab_size`); the real shapes carry Llama 3's 128,256-token vocabulary.
"""

from __future__ import annotations

from fm_pipeline.model.config import ModelConfig

LLAMA3_VOCAB = 128_256

_SIZES: dict[str, dict] = {
    # Test sizes: fit CPU tests with 1-4 gloo ranks (layers divisible by 2 and 4 for pp).
    "debug": dict(n_layers=4, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=192,
                  vocab_size=1024, max_seq_len=256),
    "tiny": dict(n_layers=4, dim=128, n_heads=4, n_kv_heads=2, ffn_dim=384,
                 vocab_size=2048, max_seq_len=512),
    "small": dict(n_layers=8, dim=256, n_heads=8, n_kv_heads=4, ffn_dim=768,
                  vocab_size=4096, max_seq_len=512),
    "20m": dict(n_layers=8, dim=384, n_heads=6, n_kv_heads=2, ffn_dim=1024,
                vocab_size=8192, max_seq_len=1024),
    # Mixture of Experts for CPU tests and the MoE demo: 8 experts, top 2.
    "moe-debug": dict(n_layers=4, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=192,
                      vocab_size=1024, max_seq_len=256, n_experts=8, moe_top_k=2,
                      moe_ffn_dim=96),
    "moe-tiny": dict(n_layers=4, dim=128, n_heads=4, n_kv_heads=2, ffn_dim=384,
                     vocab_size=2048, max_seq_len=512, n_experts=8, moe_top_k=2,
                     moe_ffn_dim=192, moe_shared_experts=1),
    # Mixtral 8x7B (Mistral AI's published config): 46.7B parameters, 12.9B active.
    "mixtral-8x7b": dict(n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                         vocab_size=32000, max_seq_len=32768, rope_theta=1e6, n_experts=8,
                         moe_top_k=2),
    # Mixtral 8x22B (Mistral AI's published config): 140.6B parameters, 39.2B active
    # (published: 141B, 39B).
    "mixtral-8x22b": dict(n_layers=56, dim=6144, n_heads=48, n_kv_heads=8, ffn_dim=16384,
                          vocab_size=32768, max_seq_len=65536, rope_theta=1e6, n_experts=8,
                          moe_top_k=2),
    # DeepSeek-V3's shape (its technical report, Table and Appendix): 61 layers, the first 3
    # dense (ffn 18432), 58 MoE layers of 256 routed experts (width 2048, top 8) + 1 shared.
    # Multi-head latent attention is not built here: grouped-query attention with 64 kv
    # heads stands in for it (154M weights a layer against MLA's 187M), so the model has
    # 669B parameters, 35.5B active (published: 671B, 37B, without the MTP module).
    "deepseek-v3-like": dict(n_layers=61, dim=7168, n_heads=128, n_kv_heads=64,
                             ffn_dim=18432, vocab_size=129280, max_seq_len=4096,
                             rope_theta=10000.0, n_experts=256, moe_top_k=8,
                             moe_ffn_dim=2048, moe_shared_experts=1, moe_first_dense=3),
    # Qwen3 MoE (Qwen's published configs, Qwen/Qwen3-*/config.json): every layer MoE, no
    # shared expert, 64 (32) query heads of 128 over a 4096 (2048) wide model. Qwen3's
    # per-head q/k RMSNorms (256 weights a layer) are not built. 235.1B params, 22.2B active;
    # 30.5B, 3.3B active.
    "qwen3-235b-a22b": dict(n_layers=94, dim=4096, n_heads=64, n_kv_heads=4, attn_head_dim=128,
                            ffn_dim=12288, vocab_size=151936, max_seq_len=4096,
                            rope_theta=1e6, n_experts=128, moe_top_k=8, moe_ffn_dim=1536),
    "qwen3-30b-a3b": dict(n_layers=48, dim=2048, n_heads=32, n_kv_heads=4, attn_head_dim=128,
                          ffn_dim=6144, vocab_size=151936, max_seq_len=4096, rope_theta=1e6,
                          n_experts=128, moe_top_k=8, moe_ffn_dim=768),
    # Llama 3 / 3.1 / 3.2 shapes (Meta's published configs).
    "llama3-1b": dict(n_layers=16, dim=2048, n_heads=32, n_kv_heads=8, ffn_dim=8192,
                      vocab_size=LLAMA3_VOCAB, max_seq_len=8192, rope_theta=500000.0,
                      tie_embeddings=True),
    "llama3-3b": dict(n_layers=28, dim=3072, n_heads=24, n_kv_heads=8, ffn_dim=8192,
                      vocab_size=LLAMA3_VOCAB, max_seq_len=8192, rope_theta=500000.0,
                      tie_embeddings=True),
    "llama3-8b": dict(n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                      vocab_size=LLAMA3_VOCAB, max_seq_len=8192, rope_theta=500000.0),
    "llama3-70b": dict(n_layers=80, dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672,
                       vocab_size=LLAMA3_VOCAB, max_seq_len=8192, rope_theta=500000.0),
    "llama3-405b": dict(n_layers=126, dim=16384, n_heads=128, n_kv_heads=8, ffn_dim=53248,
                        vocab_size=LLAMA3_VOCAB, max_seq_len=8192, rope_theta=500000.0),
    # The seed job's ~100B model (2,048 GPUs as tp 8 x pp 16 x dp 16): 80 layers split
    # evenly over 16 stages, 80 heads and 8 kv heads over tp 8. 101.7B parameters.
    "fm-100b": dict(n_layers=80, dim=10240, n_heads=80, n_kv_heads=8, ffn_dim=32768,
                    vocab_size=LLAMA3_VOCAB, max_seq_len=8192, rope_theta=500000.0),
    # A dense ~1T-parameter Llama-style shape for planning at the largest scale.
    "dense-1t": dict(n_layers=128, dim=25600, n_heads=160, n_kv_heads=16, ffn_dim=81920,
                     vocab_size=LLAMA3_VOCAB, max_seq_len=8192, rope_theta=500000.0),
}


def model_names() -> list[str]:
    return list(_SIZES)


def get_model_config(name: str, **overrides) -> ModelConfig:
    """The named shape, with any field overridden (e.g. the tokenizer's vocab_size)."""
    if name not in _SIZES:
        raise ValueError(f"unknown model size {name!r}; known sizes: {', '.join(_SIZES)}")
    return ModelConfig(**{**_SIZES[name], **overrides})
