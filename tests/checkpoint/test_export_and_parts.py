"""Our checkpoints stay readable by torch's own tools, and model parts (pipeline stages)
merge into one state dict with global FQNs that loads into any other split."""

from __future__ import annotations

import copy

import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from fm_pipeline.catalog import latest_valid
from fm_pipeline.checkpoint import (
    CheckpointManager,
    ModelState,
    OptimizerState,
    export_torch_save,
    restore_latest,
)
from fm_pipeline.checkpoint.state import OPTIM_OPTIONS, unpack_param_groups
from tests.checkpoint.tiny import TinyLM, Trainer, tiny_job
from tests import local_site


def test_dcp_to_torch_save_reads_our_checkpoint(tmp_path):
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(tiny_job(), trainer.app_state, async_save=True, site=local_site.site())
    trainer.step(1)
    manager.save(1, tokens_seen=32)
    manager.close()
    out = export_torch_save(latest_valid(tiny_job(), root=local_site.root_of(tiny_job())).found, tmp_path / "export.pt")
    exported = torch.load(out, weights_only=False)
    assert set(exported) == {"model", "optimizer", "lr_scheduler", "dataloader"}
    live = trainer.model.state_dict()
    assert exported["model"].keys() == live.keys()
    assert all(torch.equal(exported["model"][k], live[k]) for k in live)
    assert exported["dataloader"] == {"samples_consumed": 4}
    assert torch.equal(exported["optimizer"]["state.out.weight.exp_avg"],
                       trainer.opt.state[trainer.model.out.weight]["exp_avg"])


def _stages(full: TinyLM) -> list[TinyLM]:
    """Two pipeline stages cut from one model: same FQNs, each holding only its layers."""
    first, last = copy.deepcopy(full), copy.deepcopy(full)
    del first.layers["1"]
    first.out = None
    del last.layers["0"]
    last.embed = None
    return [first, last]


def test_pipeline_stage_parts_save_and_load_into_an_unsplit_model():
    torch.manual_seed(0)
    parts = _stages(TinyLM())
    optims = [torch.optim.AdamW(p.parameters(), lr=1e-2) for p in parts]
    for p in parts:
        for w in p.parameters():
            w.grad = torch.randn_like(w)
    for o in optims:
        o.step()
    app_state = {"model": ModelState(parts), "optimizer": OptimizerState(parts, optims)}
    merged = app_state["model"].state_dict()
    assert sorted(merged) == sorted(TinyLM().state_dict())  # global FQNs, nothing renamed
    manager = CheckpointManager(tiny_job(), app_state, async_save=False, site=local_site.site())
    manager.save(1, tokens_seen=32)
    manager.close()

    whole = TinyLM()
    whole_opt = torch.optim.AdamW(whole.parameters(), lr=1e-2)
    restore_latest({"model": ModelState(whole), "optimizer": OptimizerState(whole, whole_opt)},
                   tiny_job(), root=local_site.root_of(tiny_job()))
    restored = whole.state_dict()
    assert all(torch.equal(restored[k], v) for k, v in merged.items())
    saved_opt = unpack_param_groups(app_state["optimizer"].state_dict())
    loaded_opt = get_optimizer_state_dict(whole, whole_opt, options=OPTIM_OPTIONS)
    assert loaded_opt.keys() == saved_opt.keys()
    assert all(torch.equal(loaded_opt[k], v) if isinstance(v, torch.Tensor)
               else loaded_opt[k] == v for k, v in saved_opt.items())

    # ...and back into two stages of a fresh model
    fresh = _stages(TinyLM(n_layers=2))
    back = {"model": ModelState(fresh)}
    restore_latest(back, tiny_job(), root=local_site.root_of(tiny_job()))
    for part in fresh:
        for k, v in part.state_dict().items():
            assert torch.equal(v, merged[k])
