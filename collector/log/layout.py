"""The log's on-disk layout: named databases, meta keys and key encodings.

One LMDB environment (``data.mdb``, ``lock.mdb``) in the log directory, with
these named databases (all integers big-endian, so LMDB's byte order is
numeric order):

``records``        u64 seq -> envelope bytes (a serialized veritap.v1.Entry),
                   written with append=True; seqs start at 1 and have no gaps
                   above the retention floor.
``meta``           the keys in `MetaKey`.
``checkpoints``    u64 tree size -> serialized veritap.v1.Checkpoint.
``tree``           u8 level || u64 index -> 32-byte hash of the perfect subtree
                   covering leaves [index << level, (index + 1) << level)
                   (0-based leaf = seq - 1); kept for levels >= `TREE_LEVEL`,
                   plus the smaller subtrees left whole below the floor by a prune.
``by_record_id``   record id (UTF-8) -> u64 seq.
``by_model_time``  u16 length || model (UTF-8, at most `MODEL_KEY_MAX` bytes) ||
                   u64 request_first_byte_ns || u64 seq -> empty.

``writer.lock`` beside them is flock()ed by the one process that writes.
"""

from __future__ import annotations

import struct
from enum import Enum

FORMAT_VERSION = 1
TREE_LEVEL = 8
MODEL_KEY_MAX = 256
RECORD_ID_MAX = 256
MAX_DBS = 8
WRITER_LOCK = "writer.lock"


class Db(bytes, Enum):
    RECORDS = b"records"
    META = b"meta"
    CHECKPOINTS = b"checkpoints"
    TREE = b"tree"
    BY_RECORD_ID = b"by_record_id"
    BY_MODEL_TIME = b"by_model_time"


class MetaKey(bytes, Enum):
    # u32 layout version (FORMAT_VERSION).
    FORMAT = b"format"
    # The log's origin, UTF-8.
    ORIGIN = b"origin"
    # C2SP key id (4 bytes) of the checkpoint key; empty for a log without one.
    KEY_ID = b"key_id"
    # The checkpoint key as a C2SP verifier-key string, for information only.
    VERIFIER_KEY = b"verifier_key"
    # u64 head seq || 32-byte hash of the head entry (zero hash when empty).
    HEAD = b"head"
    # merkle.Frontier.to_bytes() of the tree of all entries up to the head.
    FRONTIER = b"frontier"
    # u64 retention floor: the lowest seq still stored (1 until a prune).
    FLOOR = b"floor"
    # 32-byte hash of entry floor-1 (zero hash while the floor is 1).
    FLOOR_PREV_HASH = b"floor_prev_hash"
    # merkle.Frontier.to_bytes() of the tree of entries 1..floor-1.
    FLOOR_FRONTIER = b"floor_frontier"


_U64 = struct.Struct(">Q")
_HEAD = struct.Struct(">Q32s")
_TREE = struct.Struct(">BQ")

u64 = _U64.pack


def read_u64(data: bytes) -> int:
    value: int = _U64.unpack(data)[0]
    return value


def pack_head(seq: int, head_hash: bytes) -> bytes:
    return _HEAD.pack(seq, head_hash)


def unpack_head(data: bytes) -> tuple[int, bytes]:
    seq, head_hash = _HEAD.unpack(data)
    return int(seq), bytes(head_hash)


def tree_key(level: int, index: int) -> bytes:
    return _TREE.pack(level, index)


def model_prefix(model: str) -> bytes:
    """The by_model_time key prefix of a model (its name truncated to MODEL_KEY_MAX bytes)."""
    name = model.encode()[:MODEL_KEY_MAX]
    return len(name).to_bytes(2, "big") + name


def model_time_key(prefix: bytes, time_ns: int, seq: int) -> bytes:
    return prefix + _U64.pack(time_ns) + _U64.pack(seq)


def seq_of_model_time_key(key: bytes) -> tuple[int, int]:
    """(request_first_byte_ns, seq) from a by_model_time key."""
    return read_u64(key[-16:-8]), read_u64(key[-8:])
