"""TensorFlow's tensor-bundle checkpoint format (``variables.index`` + ``variables.data-*``), read with numpy.

A SavedModel's variables are a bundle: ``variables.index`` is a LevelDB-format table (sorted keys,
prefix-compressed blocks, an index block and a 48-byte footer) mapping each tensor's name to a
``BundleEntryProto`` (dtype, shape, shard, offset, size, crc32c), and each ``variables.data-NNNNN-of-MMMMM``
shard holds the tensors' raw little-endian bytes back to back. The key "" holds a ``BundleHeaderProto``.
No TensorFlow and no protobuf library: the few protobuf fields needed are decoded here.

Only what a dense checkpoint uses is read: uncompressed table blocks (TF writes them so), numeric dtypes and
whole tensors (no partitioned slices). Anything else is a ``BundleError`` with one line saying what. The
tables' block checksums (CRC-32C) are checked; the tensors' own CRC-32C is not (a pure-Python CRC over
hundreds of MB is too slow, and the zip entries the bundle comes in carry a CRC-32 that zipfile checks).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TABLE_MAGIC = 0xDB4775248B80FB57  # LevelDB's table magic number, the footer's last 8 bytes
FOOTER_BYTES = 48  # two block handles, padded to 40 bytes, + the magic
BLOCK_TRAILER_BYTES = 5  # a compression-type byte and a masked CRC-32C of the block and that byte
NO_COMPRESSION = 0
# TF's DataType enum values (types.proto) -> numpy's little-endian dtype
DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"),  # DT_FLOAT
    2: np.dtype("<f8"),  # DT_DOUBLE
    3: np.dtype("<i4"),  # DT_INT32
    4: np.dtype("u1"),  # DT_UINT8
    5: np.dtype("<i2"),  # DT_INT16
    6: np.dtype("i1"),  # DT_INT8
    9: np.dtype("<i8"),  # DT_INT64
    10: np.dtype("?"),  # DT_BOOL
    17: np.dtype("<u2"),  # DT_UINT16
    19: np.dtype("<f2"),  # DT_HALF
    22: np.dtype("<u4"),  # DT_UINT32
    23: np.dtype("<u8"),  # DT_UINT64
}
DTYPE_IDS = {dtype: code for code, dtype in DTYPES.items()}


class BundleError(Exception):
    """A tensor bundle cannot be read; the message is one line that says which file and why."""


@dataclass(frozen=True)
class Entry:
    """Where one tensor is: a ``BundleEntryProto``'s fields."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int

    def read(self, data: bytes | memoryview | np.ndarray) -> np.ndarray:
        """The tensor from its shard's bytes (a view when ``data`` is a memory map)."""
        if self.offset + self.size > len(data):
            raise BundleError(
                f"tensor {self.name!r} lies past the end of its data file ({self.offset + self.size}"
                f" > {len(data)} bytes): the data file is truncated"
            )
        count = int(np.prod(self.shape, dtype=np.int64))
        if count * self.dtype.itemsize != self.size:
            raise BundleError(
                f"tensor {self.name!r} has {self.size} bytes for shape {self.shape} of {self.dtype}"
            )
        flat = np.frombuffer(data, dtype=np.uint8, count=self.size, offset=self.offset)
        return flat.view(self.dtype).reshape(self.shape)


# ---- CRC-32C (Castagnoli), for the table's small blocks --------------------------------------------------


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


CRC_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """LevelDB's masked CRC: a CRC stored beside data that itself holds CRCs is rotated and offset."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# ---- varints and protobuf fields ------------------------------------------------------------------------


def varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it."""
    value, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise ValueError("a varint runs past the end")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint is longer than 10 bytes")


def proto_fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: ints for varint and fixed fields, bytes for the rest."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
            yield number, value
        elif wire == 1:
            yield number, int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        elif wire == 2:
            length, pos = varint(buf, pos)
            if pos + length > len(buf):
                raise ValueError("a field runs past the end of its message")
            yield number, buf[pos : pos + length]
            pos += length
        elif wire == 5:
            yield number, int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"unknown wire type {wire}")
    if pos != len(buf):
        raise ValueError("a field runs past the end of its message")


def _shape(buf: bytes) -> tuple[int, ...]:
    dims = []
    for number, value in proto_fields(buf):
        if number == 2 and isinstance(value, bytes):  # TensorShapeProto.dim
            size = 0
            for dim_number, dim_value in proto_fields(value):
                if dim_number == 1 and isinstance(dim_value, int):
                    size = dim_value
            dims.append(size)
        elif number == 3 and value:  # unknown_rank
            raise ValueError("a tensor of unknown rank")
    return tuple(dims)


def parse_entry(name: str, buf: bytes) -> Entry:
    """A ``BundleEntryProto``: dtype 1, shape 2, shard_id 3, offset 4, size 5, crc32c 6, slices 7."""
    dtype_id, shape, shard_id, offset, size = 0, (), 0, 0, 0
    for number, value in proto_fields(buf):
        if number == 1 and isinstance(value, int):
            dtype_id = value
        elif number == 2 and isinstance(value, bytes):
            shape = _shape(value)
        elif number == 3 and isinstance(value, int):
            shard_id = value
        elif number == 4 and isinstance(value, int):
            offset = value
        elif number == 5 and isinstance(value, int):
            size = value
        elif number == 7:
            raise ValueError("a partitioned tensor (slices), which this reader does not join")
    if dtype_id not in DTYPES:
        raise ValueError(f"dtype {dtype_id} is not a numeric type this reader knows")
    return Entry(name, DTYPES[dtype_id], shape, shard_id, offset, size)


# ---- the LevelDB table ----------------------------------------------------------------------------------


def _block(table: bytes, offset: int, size: int) -> bytes:
    end = offset + size
    if end + BLOCK_TRAILER_BYTES > len(table):
        raise ValueError(f"a block at {offset} runs past the end of the file")
    contents = table[offset:end]
    kind = table[end]
    (stored,) = struct.unpack_from("<I", table, end + 1)
    if masked_crc(table[offset : end + 1]) != stored:
        raise ValueError(f"the block at {offset} fails its checksum")
    if kind != NO_COMPRESSION:
        raise ValueError(f"the block at {offset} is compressed (type {kind}); TF writes them uncompressed")
    return contents


def block_entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of one block: each entry shares a prefix with the key before it."""
    if len(block) < 4:
        raise ValueError("a block is shorter than its restart count")
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise ValueError("a block's restart array is longer than the block")
    pos, key = 0, b""
    while pos < end:
        shared, pos = varint(block, pos)
        unshared, pos = varint(block, pos)
        length, pos = varint(block, pos)
        if shared > len(key) or pos + unshared + length > end:
            raise ValueError("a block entry runs past the end of its block")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        yield key, block[pos : pos + length]
        pos += length


def table_items(table: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of a LevelDB-format table, in key order."""
    if len(table) < FOOTER_BYTES:
        raise ValueError(f"{len(table)} bytes is shorter than a table's footer")
    (magic,) = struct.unpack_from("<Q", table, len(table) - 8)
    if magic != TABLE_MAGIC:
        raise ValueError("no table magic number at its end (not a LevelDB-format table, or truncated)")
    footer = table[len(table) - FOOTER_BYTES :]
    _meta_offset, pos = varint(footer, 0)
    _meta_size, pos = varint(footer, pos)
    index_offset, pos = varint(footer, pos)
    index_size, pos = varint(footer, pos)
    for _last_key, handle in block_entries(_block(table, index_offset, index_size)):
        offset, pos = varint(handle, 0)
        size, _ = varint(handle, pos)
        yield from block_entries(_block(table, offset, size))


# ---- the bundle -----------------------------------------------------------------------------------------


def read_index(index: Path) -> dict[str, Entry]:
    """Every tensor's entry in a bundle's ``variables.index``, by name.

    Raises:
        BundleError: the file is missing, not a table, damaged, or holds what this reader does not read.
    """
    try:
        table = index.read_bytes()
    except OSError as exc:
        raise BundleError(f"cannot read {index}: {exc.strerror or exc}") from None
    entries: dict[str, Entry] = {}
    shards = 1
    try:
        for key, value in table_items(table):
            if key == b"":  # BundleHeaderProto: num_shards 1, endianness 2 (0 little), version 3
                for number, field_value in proto_fields(value):
                    if number == 1 and isinstance(field_value, int):
                        shards = field_value
                    elif number == 2 and field_value:
                        raise ValueError("a big-endian bundle")
                continue
            name = key.decode("utf-8")
            entries[name] = parse_entry(name, value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleError(f"{index} is not a readable tensor-bundle index: {exc}") from None
    for entry in entries.values():
        if not 0 <= entry.shard_id < max(shards, 1):
            raise BundleError(f"{index}: tensor {entry.name!r} is in shard {entry.shard_id} of {shards}")
    return entries


def data_path(index: Path, shard: int, shards: int) -> Path:
    """``variables.data-00000-of-00001`` beside ``variables.index``."""
    return index.with_name(f"{index.stem}.data-{shard:05d}-of-{shards:05d}")


def read_bundle(index: Path) -> dict[str, np.ndarray]:
    """Every tensor of a bundle, as read-only numpy arrays over memory maps of its data files.

    Raises:
        BundleError: the index or a data file is missing, damaged or truncated.
    """
    entries = read_index(index)
    shards = max((entry.shard_id for entry in entries.values()), default=0) + 1
    maps = {}
    for shard in range(shards):
        path = data_path(index, shard, shards)
        if not path.is_file():
            raise BundleError(f"{path} is missing (the data file beside {index.name})")
        maps[shard] = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else b""
    return {name: entry.read(maps[entry.shard_id]) for name, entry in entries.items()}


def write_bundle(index: Path, tensors: dict[str, np.ndarray], block_bytes: int = 4096) -> None:
    """Write ``tensors`` as a one-shard bundle (for tests, and to show the format round-trips).

    Blocks are cut near ``block_bytes`` as LevelDB does, so a small value gives a multi-block table.
    """
    data = bytearray()
    items: list[tuple[bytes, bytes]] = [(b"", _field_varint(1, 1) + _field_varint(3, 1))]
    for name in sorted(tensors):
        array = np.asarray(tensors[name], order="C")  # (ascontiguousarray makes a scalar 1-d)
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        raw = array.astype(dtype, copy=False).tobytes()
        shape = b"".join(_field_bytes(2, _field_varint(1, dim)) for dim in array.shape)
        entry = (
            _field_varint(1, DTYPE_IDS[np.dtype(dtype)]) + _field_bytes(2, shape)
            + _field_varint(4, len(data)) + _field_varint(5, len(raw))
        )  # fmt: skip
        items.append((name.encode("utf-8"), entry))
        data += raw
    index.parent.mkdir(parents=True, exist_ok=True)
    data_path(index, 0, 1).write_bytes(bytes(data))
    index.write_bytes(build_table(items, block_bytes))


def build_table(items: list[tuple[bytes, bytes]], block_bytes: int = 4096, restart_every: int = 16) -> bytes:
    """A LevelDB-format table of sorted ``items`` (no compression, no filter, an empty metaindex)."""
    out = bytearray()
    index_items: list[tuple[bytes, bytes]] = []
    pending: list[tuple[bytes, bytes]] = []

    def flush() -> None:
        if pending:
            handle = _write_block(out, pending, restart_every)
            index_items.append((pending[-1][0], handle))
            pending.clear()

    for key, value in items:
        pending.append((key, value))
        if sum(len(k) + len(v) for k, v in pending) >= block_bytes:
            flush()
    flush()
    meta = _write_block(out, [], restart_every)
    index = _write_block(out, index_items, restart_every)
    footer = meta + index
    out += footer + b"\0" * (40 - len(footer)) + struct.pack("<Q", TABLE_MAGIC)
    return bytes(out)


def _write_block(out: bytearray, items: list[tuple[bytes, bytes]], restart_every: int) -> bytes:
    block, restarts, last = bytearray(), [], b""
    for number, (key, value) in enumerate(items):
        shared = 0
        if number % restart_every == 0:
            restarts.append(len(block))
        else:
            while shared < min(len(key), len(last)) and key[shared] == last[shared]:
                shared += 1
        block += _varint(shared) + _varint(len(key) - shared) + _varint(len(value))
        block += key[shared:] + value
        last = key
    restarts = restarts or [0]
    block += b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))
    offset = len(out)
    trailer = bytes([NO_COMPRESSION])
    out += block + trailer + struct.pack("<I", masked_crc(bytes(block) + trailer))
    return _varint(offset) + _varint(len(block))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_varint(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _field_bytes(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value
