"""FP8 linear layers: which layers convert, that they really compute in FP8, and that the
parameters (what checkpoints hold) do not change."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fm_pipeline.model import Transformer, get_model_config
from fm_pipeline.parallel.float8 import apply_float8


def _model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(get_model_config("debug"))
    model.init_weights(seed=seed)
    return model


def _loss(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_block_linears_compute_in_fp8_and_the_output_layer_does_not(recipe):
    from torchao.float8.float8_linear import Float8Linear

    reference, model = _model(), _model()
    converted = apply_float8(model, recipe=recipe, fsdp=False)
    cfg = get_model_config("debug")
    assert converted == cfg.n_layers * 7  # wq wk wv wo w1 w2 w3 in every block
    assert sum(isinstance(m, Float8Linear) for m in model.modules()) == converted
    assert type(model.output) is nn.Linear
    # Same parameters under the same names: checkpoints move between bf16 and FP8 runs.
    assert {k: v.dtype for k, v in model.state_dict().items()} == {
        k: v.dtype for k, v in reference.state_dict().items()}
    tokens = torch.randint(0, cfg.vocab_size, (2, 65), generator=torch.Generator().manual_seed(1))
    fp8, bf16 = _loss(model, tokens), _loss(reference, tokens)
    # FP8 GEMMs: close to the bf16 loss, never equal to it (the casts round).
    assert fp8.item() == pytest.approx(bf16.item(), abs=0.05) and fp8.item() != bf16.item()
    fp8.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_widths_fp8_gemms_cannot_take_stay_bf16():
    model = nn.Module()
    model.layers = nn.ModuleDict({"0": nn.Sequential(nn.Linear(64, 40), nn.Linear(48, 64))})
    assert apply_float8(model, recipe="tensorwise", fsdp=False) == 1  # 40 is no multiple of 16


def test_a_spec_asks_for_fp8_by_recipe_and_is_refused_what_the_trainer_lacks():
    from fm_pipeline.config import JobSpecError, compute_dtype, fp8_recipe
    from fm_pipeline.data.testing import small_job

    job = small_job(**{"parallelism.mixed_precision": "fp8"})
    assert job.parallelism.mixed_precision == "fp8-tensorwise"
    assert (fp8_recipe("fp8-rowwise"), compute_dtype("fp8-rowwise")) == ("rowwise", "bf16")
    with pytest.raises(JobSpecError, match="fp8-blockwise"):
        small_job(**{"parallelism.mixed_precision": "fp8-blockwise"})
    with pytest.raises(JobSpecError, match="Mixture of Experts") as e:
        small_job(**{"model.size": "moe-debug", "parallelism.mixed_precision": "fp8-rowwise"})
    assert "parallelism.mixed_precision" in str(e.value)
