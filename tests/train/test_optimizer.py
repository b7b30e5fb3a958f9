"""AdamW's implementation follows the device (fused on CUDA, foreach on CPU) and checkpoints
move between the two: same state layout, and loading keeps the running optimizer's choice."""

from __future__ import annotations

import copy

import pytest
import torch

from fm_pipeline.checkpoint import OptimizerState
from fm_pipeline.data.testing import small_job
from fm_pipeline.model import Transformer
from fm_pipeline.train.optimizer import adamw_implementation, build_optimizer

TRAINING = small_job().training


def test_fused_on_cuda_foreach_elsewhere():
    assert adamw_implementation(torch.device("cuda", 0)) == {"fused": True}
    assert adamw_implementation(torch.device("cpu")) == {"foreach": True}
    opt = build_optimizer(_model(), TRAINING)  # parameters on the CPU here
    assert all(g["foreach"] and not g["fused"] for g in opt.param_groups)


def _model() -> Transformer:
    model = Transformer(small_job(**{"model.n_layers": 2}).model_cfg)
    model.init_weights(seed=1)
    return model


def _train_step(model: Transformer, opt: torch.optim.Optimizer, seed: int) -> None:
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 17),
                           generator=torch.Generator().manual_seed(seed))
    logits = model(tokens[:, :-1])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("saved_with, loaded_with", [("fused", "foreach"), ("foreach", "fused")])
def test_a_checkpoint_of_one_implementation_resumes_in_the_other(saved_with, loaded_with):
    # CPU has a fused AdamW too: both sides of the CUDA/CPU switch run here.
    writer = _model()
    opt = torch.optim.AdamW(writer.parameters(), lr=1e-2, **{saved_with: True})
    _train_step(writer, opt, seed=0)
    saved = copy.deepcopy(OptimizerState(writer, opt).state_dict())  # as if written to disk

    reader = _model()
    reader.load_state_dict(writer.state_dict())
    opt2 = torch.optim.AdamW(reader.parameters(), lr=1e-2, **{loaded_with: True})
    state = OptimizerState(reader, opt2)
    assert state.state_dict().keys() == saved.keys()  # the same layout in the checkpoint
    state.load_state_dict(saved)
    assert opt2.param_groups[0][loaded_with] and not opt2.param_groups[0][saved_with]
    assert opt2.state_dict()["state"][0]["step"].item() == 1

    _train_step(writer, opt, seed=1)  # both continue: the same update up to rounding
    _train_step(reader, opt2, seed=1)
    for (name, a), b in zip(writer.named_parameters(), reader.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
