"""The numpy reader of TensorFlow's tensor-bundle format, on bundles these tests write themselves (a
LevelDB-format table with prefix-compressed keys, several blocks, checksums) and on damaged ones."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from bertknn_search.models.tensor_bundle import (
    BundleError,
    block_entries,
    build_table,
    crc32c,
    read_bundle,
    read_index,
    table_items,
    write_bundle,
)


def tensors(count: int = 40) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {
        "module/bert/embeddings/word_embeddings": rng.standard_normal((11, 4)).astype(np.float32),
        "global_step": np.array(1234, dtype=np.int64),  # a scalar: shape ()
        "module/bert/mask": np.array([True, False, True]),
        "module/bert/half": rng.standard_normal((2, 3)).astype(np.float16),
        "module/bert/ids": np.arange(6, dtype=np.int32).reshape(3, 2),
        "module/bert/empty": np.zeros((0, 5), dtype=np.float64),
    }
    for i in range(count):  # long shared prefixes: prefix compression and restarts at work
        out[f"module/bert/encoder/layer_{i}/attention/self/query/kernel"] = rng.standard_normal(
            (3, 2)
        ).astype(np.float32)
    return out


def test_crc32c_is_castagnoli() -> None:
    # The check value of CRC-32C (RFC 3720, appendix B.4): "123456789" -> 0xE3069283.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


@pytest.mark.parametrize("block_bytes", [64, 4096])
def test_a_bundle_written_here_reads_back_exactly(tmp_path: Path, block_bytes: int) -> None:
    written = tensors()
    index = tmp_path / "variables" / "variables.index"
    write_bundle(index, written, block_bytes=block_bytes)
    assert (tmp_path / "variables" / "variables.data-00000-of-00001").is_file()
    read = read_bundle(index)
    assert set(read) == set(written)
    for name, array in written.items():
        assert read[name].dtype == array.dtype, name
        assert read[name].shape == array.shape, name
        np.testing.assert_array_equal(read[name], array)
    entries = read_index(index)
    assert entries["global_step"].shape == ()
    assert sum(e.size for e in entries.values()) == sum(a.nbytes for a in written.values())


def test_small_blocks_make_a_table_of_several_blocks_in_key_order(tmp_path: Path) -> None:
    items = [(f"key/{i:04d}".encode(), f"value {i}".encode()) for i in range(300)]
    table = build_table(items, block_bytes=100, restart_every=4)
    # The index block (just before the footer) names one data block per ~100 bytes of entries.
    footer = table[-48:]
    assert struct.unpack_from("<Q", footer, 40)[0] == 0xDB4775248B80FB57
    assert list(table_items(table)) == items
    assert len(table) > 300 * 10  # many blocks, each with its restart array and trailer


def test_entries_share_prefixes_with_the_key_before_them() -> None:
    items = [(b"module/bert/a", b"1"), (b"module/bert/b", b"2"), (b"module/cls/c", b"3")]
    table = build_table(items, restart_every=16)
    assert list(table_items(table)) == items
    assert b"module/bert/b" not in table  # only its last letter: it shares "module/bert/" with the key before


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:-1], "no table magic number at its end"),
        (lambda b: b[:20], "shorter than a table's footer"),
        (lambda b: bytes([b[0] ^ 0xFF]) + b[1:], "fails its checksum"),
        (lambda b: b"\0" * len(b), "no table magic number"),
    ],
)
def test_a_damaged_index_is_one_line_naming_the_file(tmp_path: Path, damage: object, message: str) -> None:
    index = tmp_path / "variables.index"
    write_bundle(index, tensors(3))
    index.write_bytes(damage(index.read_bytes()))  # type: ignore[operator]
    with pytest.raises(BundleError, match=message) as caught:
        read_index(index)
    text = str(caught.value)
    assert "\n" not in text and str(index) in text


def test_a_truncated_or_missing_data_file_is_named(tmp_path: Path) -> None:
    index = tmp_path / "variables.index"
    write_bundle(index, tensors(3))
    data = tmp_path / "variables.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:-4])
    with pytest.raises(BundleError, match=r"past the end of its data file.*truncated"):
        read_bundle(index)
    data.unlink()
    with pytest.raises(BundleError, match=r"variables\.data-00000-of-00001 is missing"):
        read_bundle(index)
    with pytest.raises(BundleError, match=r"cannot read .*nothing\.index"):
        read_index(tmp_path / "nothing.index")


def test_an_unknown_dtype_and_a_partitioned_tensor_are_refused(tmp_path: Path) -> None:
    index = tmp_path / "variables.index"
    # dtype 7 (DT_STRING) and a BundleEntryProto with slices (field 7): not read, said so.
    for value, message in [(b"\x08\x07", "dtype 7 is not a numeric type"), (b"\x08\x01\x3a\x00", "slices")]:
        index.write_bytes(build_table([(b"", b""), (b"t", value)]))
        with pytest.raises(BundleError, match=message):
            read_index(index)


def test_a_block_entry_running_past_its_block_is_an_error() -> None:
    block = bytes([0, 5, 50]) + b"hello" + struct.pack("<I", 0) + struct.pack("<I", 1)
    with pytest.raises(ValueError, match="runs past the end of its block"):
        list(block_entries(block))
