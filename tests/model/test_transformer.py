"""The decoder: exact parameter counts shared with the planner, stage splits, initialisation."""

from __future__ import annotations

import pytest
import torch

from fm_pipeline.model import Transformer, count_params, get_model_config, model_names
from fm_pipeline.parallel.pipeline_parallel import build_stage_module


@pytest.mark.parametrize("size", model_names())
def test_parameter_count_equals_the_planners_formula(size):
    cfg = get_model_config(size)
    with torch.device("meta"):  # 1T parameters cost nothing on meta
        model = Transformer(cfg)
    assert sum(p.numel() for p in model.parameters()) == count_params(cfg).total


def test_tied_embeddings_have_one_matrix():
    cfg = get_model_config("debug", tie_embeddings=True)
    model = Transformer(cfg)
    assert model.output is None
    assert sum(p.numel() for p in model.parameters()) == count_params(cfg).total
    model.init_weights(seed=0)
    logits = model(torch.randint(0, cfg.vocab_size, (2, 16)))
    assert logits.shape == (2, 16, cfg.vocab_size)


def test_pipeline_stages_partition_the_parameters_under_their_full_names():
    cfg = get_model_config("debug")
    whole = dict(Transformer(cfg).named_parameters())
    names = []
    for stage in range(4):
        part = build_stage_module(cfg, stage=stage, n_stages=4)
        names += [n for n, _ in part.named_parameters()]
    assert sorted(names) == sorted(whole)


def test_stages_chained_compute_the_whole_model():
    cfg = get_model_config("debug")
    whole = Transformer(cfg)
    whole.init_weights(seed=7)
    stages = [build_stage_module(cfg, stage=s, n_stages=2) for s in range(2)]
    for stage in stages:
        stage.init_weights(seed=7)
    tokens = torch.randint(0, cfg.vocab_size, (2, 24))
    torch.testing.assert_close(stages[1](stages[0](tokens)), whole(tokens), rtol=0, atol=0)


def test_initialisation_is_deterministic_and_seeded():
    cfg = get_model_config("debug")
    a, b, c = Transformer(cfg), Transformer(cfg), Transformer(cfg)
    a.init_weights(seed=1)
    b.init_weights(seed=1)
    c.init_weights(seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name


def test_an_untrained_model_predicts_near_uniformly():
    cfg = get_model_config("debug")
    model = Transformer(cfg)
    model.init_weights(seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (4, 32))
    loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    assert abs(loss.item() - torch.log(torch.tensor(cfg.vocab_size)).item()) < 1.5


def test_causal_the_past_does_not_see_the_future():
    cfg = get_model_config("debug")
    model = Transformer(cfg)
    model.init_weights(seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % cfg.vocab_size
    torch.testing.assert_close(model(tokens)[:, :10], model(changed)[:, :10])
