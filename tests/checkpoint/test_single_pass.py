"""Single-pass saves and restores: checksums come from the bytes as they are written and as
they are loaded, a corrupt file is refused by name before any Stateful part is loaded, and
tensors are read straight from the file's records exactly as torch.load reads them."""

from __future__ import annotations

import io

import os

import pytest
import torch
import torch.utils.serialization.config as serialization_config

from fm_pipeline.catalog import CheckpointInvalid, CheckpointRef
from fm_pipeline.catalog.manifest import checksum_file
from fm_pipeline.checkpoint import CheckpointManager, restore
from fm_pipeline.checkpoint.torch_records import locate, tensor_view
from tests.checkpoint.tiny import TinyLM, Trainer, tiny_job
from tests import local_site

RECORDS = {
    "fp32": torch.randn(100, 64),
    "bf16 rows of a larger storage": torch.randn(100, 64).to(torch.bfloat16)[10:20],
    "transposed": torch.randn(8, 6).t(),
    "scalar": torch.tensor(3.5),
    "empty": torch.empty(0, 5),
    "strided int64": torch.arange(10)[2:9:3],
    "permuted fp16": torch.randn(3, 4, 5).to(torch.float16).permute(2, 0, 1),
    "bool": torch.ones(4, dtype=torch.bool),
}


@pytest.mark.parametrize("crc", [False, True], ids=["no-zip-crc", "zip-crc"])
@pytest.mark.parametrize("name", sorted(RECORDS))
def test_tensor_records_read_in_place_equal_torch_load(name, crc):
    buf = io.BytesIO()
    with serialization_config.patch({"save.compute_crc32": crc}):
        torch.save(RECORDS[name], buf)
    data = buf.getvalue()
    expected = torch.load(io.BytesIO(data), weights_only=True)
    view = tensor_view(memoryview(bytearray(data)))
    assert view is not None
    assert (view.dtype, view.shape, view.stride()) == (expected.dtype, expected.shape,
                                                       expected.stride())
    assert torch.equal(view, expected)
    rec = locate(data[:4096], data[-4096:], len(data))  # from a head and a tail peek
    assert rec is not None and rec.is_dense == (name in ("fp32", "scalar", "empty", "bool"))


def test_records_it_does_not_know_are_left_to_torch_load():
    buf = io.BytesIO()
    torch.save({"not": "a tensor"}, buf)
    assert tensor_view(memoryview(bytearray(buf.getvalue()))) is None
    assert tensor_view(memoryview(bytearray(b"\0" * 200))) is None


def _saved(checksum: str = "crc32c"):
    trainer = Trainer(TinyLM())
    manager = CheckpointManager(tiny_job(), trainer.app_state, async_save=False,
                                checksum=checksum, site=local_site.site())
    trainer.step(1)
    result = manager.save(1, tokens_seen=32).result()
    manager.close()
    return trainer, CheckpointRef.local(result.path)


@pytest.mark.parametrize("checksum", ["crc32c", "sha256"])
def test_checksums_computed_while_writing_match_the_files(checksum):
    _, ref = _saved(checksum)
    from fm_pipeline.catalog import read_manifest

    for entry in read_manifest(ref).files:
        assert checksum_file(ref.dir / entry.path, checksum) == entry.checksum, entry.path


def test_corrupt_file_is_refused_by_name_before_the_stateful_parts_load():
    saved, ref = _saved()
    shard = ref.dir / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x01  # in the last record: everything before it loads fine
    shard.write_bytes(bytes(data))
    fresh = Trainer(TinyLM())
    with pytest.raises(CheckpointInvalid, match=r"__0_0\.distcp: CRC32C mismatch"):
        restore(fresh.app_state, ref, job=tiny_job())
    # The loader's and the LR schedule's load_state_dict never ran with the corrupt bytes.
    assert fresh.cursor.samples_consumed == 0 and fresh.sched.last_epoch == 0
    assert saved.cursor.samples_consumed == 4


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
@pytest.mark.parametrize("algorithm", ["crc32c", "sha256"])
def test_stream_holds_exactly_what_was_written_with_its_checksum(tmp_path, algorithm, direct):
    # Buffered: small writes are gathered, large ones go straight out, and ranges already on
    # the disk leave the page cache. Direct: pieces cross the two aligned buffers' edges and
    # the file ends in a partial block. Windows of a few KB exercise all of it on a 1 MB file.
    from fm_pipeline.checkpoint.writer import HashingFile, _open_direct

    if direct and (fd := _open_direct(tmp_path / "probe")) is None:
        pytest.fail(f"{tmp_path}'s filesystem does not take O_DIRECT writes: the direct path "
                    "is untested here (run the suite with a temporary directory on ext4/xfs)")
    elif direct:
        os.close(fd)

    rng = torch.Generator().manual_seed(0)
    pieces = [torch.randint(0, 256, (int(n),), generator=rng, dtype=torch.uint8).numpy().tobytes()
              for n in torch.randint(0, 40_000, (60,), generator=rng)]
    pieces += [b"", bytes(100_000), b"x"]
    reported = []
    stream = HashingFile(tmp_path / "f.bin", algorithm=algorithm,
                         on_close=lambda p, n, d: reported.append((n, d)),
                         writeback_bytes=8192, drop_behind_bytes=16384, direct=direct)
    assert stream.direct is direct
    offsets = []
    for piece in pieces:
        offsets.append(stream.tell())
        assert stream.write(piece) == len(piece)
    stream.close()
    data = b"".join(pieces)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert offsets == [sum(map(len, pieces[:i])) for i in range(len(pieces))]
    assert reported == [(len(data), checksum_file(tmp_path / "f.bin", algorithm))]
