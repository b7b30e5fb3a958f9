"""The loader gives every rank its slice of one global sample sequence, for any dp size,
and resumes that sequence exactly from its state, even at another dp size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fm_pipeline.data import CorruptShardError, DataError, MixLoader
from tests.data.conftest import copy_mix

GBS, SEQ = 8, 32


def loaders(mix, dp, **kw):
    return [MixLoader(mix, dp_rank=r, dp_size=dp, micro_batch_size=2, global_batch_size=GBS,
                      seq_len=SEQ, **kw) for r in range(dp)]


def global_steps(mix, dp, steps, state=None):
    ranks = loaders(mix, dp)
    if state is not None:
        for loader in ranks:
            loader.load_state_dict(state)
    out = [torch.cat([next(loader) for loader in ranks]) for _ in range(steps)]
    return out, ranks[0].state_dict()


def test_batches_are_global_samples_in_order(small_mix):
    (loader,) = loaders(small_mix, 1)
    first, second = next(loader), next(loader)
    assert first.shape == (GBS, SEQ + 1) and first.dtype == torch.long
    assert np.array_equal(first.numpy(), small_mix.samples(0, GBS))
    assert np.array_equal(second.numpy(), small_mix.samples(GBS, GBS))
    assert int(first.max()) < small_mix.vocab_size
    assert loader.state_dict()["samples_consumed"] == 2 * GBS
    assert [m.shape[0] for m in loader.micro_batches(first)] == [2, 2, 2, 2]


@pytest.mark.parametrize("dp", [2, 4])
def test_same_global_sequence_for_any_dp_size(small_mix, dp):
    reference, _ = global_steps(small_mix, 1, steps=6)
    sharded, _ = global_steps(small_mix, dp, steps=6)
    for step, (ref, got) in enumerate(zip(reference, sharded)):
        assert torch.equal(ref, got), f"step {step} differs at dp={dp}"


def test_resume_at_another_dp_size_continues_the_sequence(small_mix):
    reference, _ = global_steps(small_mix, 1, steps=7)
    _, state = global_steps(small_mix, 2, steps=3)
    assert state["samples_consumed"] == 3 * GBS
    resumed, _ = global_steps(small_mix, 4, steps=4, state=state)
    for ref, got in zip(reference[3:], resumed):
        assert torch.equal(ref, got)


def test_resume_mid_stream_restarts_prefetch(small_mix):
    (loader,) = loaders(small_mix, 1, prefetch=4)
    next(loader)
    state = loader.state_dict()
    expected = next(loader)
    next(loader)  # the prefetch thread is now ahead of the state we roll back to
    loader.load_state_dict(state)
    assert torch.equal(next(loader), expected)
    loader.close()


def test_sequence_continues_past_one_pass(small_mix):
    n = len(small_mix)
    first_pass = small_mix.index_entries(0, n)
    second_pass = small_mix.index_entries(n, n)
    assert not np.array_equal(first_pass, second_pass)  # a new order ...
    assert np.array_equal(np.sort(first_pass), np.sort(second_pass))  # ... of the same samples


def test_source_weights_are_honoured(small_mix):
    sources = small_mix.sample_sources(0, len(small_mix))
    for entry in small_mix.manifest.sources:
        assert sources.count(entry.name) == entry.samples
        assert abs(entry.samples / len(sources) - entry.weight) < 0.01


def test_bad_loader_arguments_are_named(small_mix):
    with pytest.raises(ValueError, match="divisible by dp_size"):
        MixLoader(small_mix, dp_rank=0, dp_size=3, micro_batch_size=1, global_batch_size=8, seq_len=SEQ)
    with pytest.raises(ValueError, match="micro_batch_size"):
        MixLoader(small_mix, dp_rank=0, dp_size=2, micro_batch_size=3, global_batch_size=8, seq_len=SEQ)
    with pytest.raises(DataError, match="seq_len 64 differs"):
        MixLoader(small_mix, dp_rank=0, dp_size=1, micro_batch_size=1, global_batch_size=8, seq_len=64)
    (loader,) = loaders(small_mix, 1)
    with pytest.raises(DataError, match="resuming would change the data stream"):
        loader.load_state_dict({"samples_consumed": 8, "mix_key": "0123456789abcdef"})


def test_heldout_batches_are_fixed_and_per_source(small_mix):
    for source in small_mix.source_names:
        n = small_mix.heldout_windows(source)
        assert n >= 2
        a = list(small_mix.heldout_batches(source, batch_size=2, n_batches=3))
        b = list(small_mix.heldout_batches(source, batch_size=2, n_batches=3))
        assert len(a) == min(3, n // 2) and all(torch.equal(x, y) for x, y in zip(a, b))
        assert a[0].shape == (2, SEQ + 1)
    (loader,) = loaders(small_mix, 1, split="heldout")
    total = sum(small_mix.heldout_windows(s) for s in small_mix.source_names)
    assert sum(1 for _ in loader) == total // GBS  # finite: stops after the last full step


def test_corrupted_shard_surfaces_from_the_prefetch_thread(small_mix, tmp_path):
    mix = copy_mix(small_mix, tmp_path)
    store = mix.store
    victim = mix.manifest.sources[0].shards[0]
    data = bytearray(store.get_bytes(victim.key))
    data[10] ^= 0xFF
    store.put_bytes(bytes(data), victim.key)
    (loader,) = loaders(mix, 1)
    with pytest.raises(CorruptShardError, match=victim.key):
        for _ in range(len(mix) // GBS + 1):
            next(loader)
