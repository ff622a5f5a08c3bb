"""RFC 6962 (RFC 9162 section 2.1) Merkle tree hashing, proofs and a running frontier.

Leaves are hashed as SHA-256(0x00 || data) and interior nodes as
SHA-256(0x01 || left || right); the tree over n leaves splits at the largest
power of two smaller than n. The root of the empty tree is SHA-256("").

`Frontier` is the compact range [0, n): the roots of the perfect subtrees that
the binary representation of n decomposes the tree into, largest first. It
takes one leaf hash at a time and gives the root in O(log n) without keeping
the leaves.

Proof *generation* is written against a callback that returns the Merkle tree
hash of any range the RFC recursion asks for, so a store can answer from
whatever it keeps (stored subtree hashes, recomputed leaves). Proof
*verification* follows RFC 9162 sections 2.1.3.2 and 2.1.4.2 step by step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

_LEAF_PREFIX = b"\x00"
_NODE_PREFIX = b"\x01"
# SHA-256 with the node prefix already absorbed: a copy and two updates hash a node
# without joining prefix, left and right into a new buffer first.
_NODE_STATE = hashlib.sha256(_NODE_PREFIX)

# A completed perfect subtree: (level, index, hash). Level 0 is a leaf; the
# subtree at (level, index) covers leaves [index << level, (index + 1) << level).
Node = tuple[int, int, bytes]

# Returns the Merkle tree hash of leaves [begin, end).
RangeHasher = Callable[[int, int], bytes]


class MerkleError(Exception):
    """Base of the errors raised by this module."""


class ProofError(MerkleError):
    """A proof does not verify, or its parameters are impossible."""


class FrontierFormatError(MerkleError):
    """Serialized frontier bytes are malformed."""


def leaf_hash(data: bytes) -> bytes:
    """RFC 6962 leaf hash: SHA-256(0x00 || data)."""
    return hashlib.sha256(_LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 6962 interior node hash: SHA-256(0x01 || left || right)."""
    return hashlib.sha256(_NODE_PREFIX + left + right).digest()


def split_point(n: int) -> int:
    """The largest power of two strictly smaller than n (n >= 2): where RFC 6962 splits."""
    if n < 2:
        raise ValueError(f"cannot split a range of {n} leaves")
    return 1 << ((n - 1).bit_length() - 1)


def perfect_subtrees(begin: int, end: int) -> list[tuple[int, int]]:
    """The maximal aligned perfect subtrees covering [begin, end), left to right.

    Returned as (level, index) pairs. For the ranges the RFC 6962 recursion
    produces (begin aligned to a power of two at least end - begin), folding
    their hashes right to left gives the range's Merkle tree hash.
    """
    out: list[tuple[int, int]] = []
    pos = begin
    while pos < end:
        # Largest level allowed by pos's alignment and by what is left.
        level = (pos & -pos).bit_length() - 1 if pos else (end - pos).bit_length() - 1
        while pos + (1 << level) > end:
            level -= 1
        out.append((level, pos >> level))
        pos += 1 << level
    return out


def fold_right(hashes: Sequence[bytes]) -> bytes:
    """Combine subtree hashes, largest (leftmost) first, into one root."""
    if not hashes:
        return EMPTY_ROOT
    root = hashes[-1]
    for left in reversed(hashes[:-1]):
        root = node_hash(left, root)
    return root


class Frontier:
    """The compact range [0, size) of a growing tree: perfect subtree roots, largest first.

    With `keep_from_level`, every perfect subtree of at least that level that an
    append completes is also recorded in `completed` as (level, index, hash),
    for a store that wants to answer proofs without rehashing old leaves. The
    caller drains that list.
    """

    __slots__ = ("_hashes", "_keep", "_size", "completed")

    def __init__(
        self,
        size: int = 0,
        hashes: Sequence[bytes] = (),
        *,
        keep_from_level: int | None = None,
    ) -> None:
        if size < 0:
            raise ValueError("negative tree size")
        if len(hashes) != size.bit_count():
            raise ValueError(
                f"a frontier of size {size} holds {size.bit_count()} hashes, not {len(hashes)}"
            )
        for h in hashes:
            if len(h) != HASH_SIZE:
                raise ValueError("frontier hashes must be 32 bytes")
        self._size = size
        self._hashes = list(hashes)
        self._keep = 64 if keep_from_level is None else keep_from_level
        self.completed: list[Node] = []

    @property
    def size(self) -> int:
        return self._size

    @property
    def hashes(self) -> tuple[bytes, ...]:
        return tuple(self._hashes)

    def append(self, leaf: bytes) -> None:
        """Add the next leaf hash (already leaf-hashed, 32 bytes)."""
        self.extend((leaf,))

    def extend(self, leaves: Sequence[bytes]) -> None:
        """Add leaf hashes in order (one call for a batch: the loop is the hot path)."""
        size = self._size
        stack = self._hashes
        push = stack.append
        pop = stack.pop
        keep = self._keep
        completed = self.completed
        node_state = _NODE_STATE.copy
        for leaf in leaves:
            h = leaf
            n = size
            size += 1
            level = 0
            # Half of all leaves start a subtree of their own; the rest complete one or more.
            while n & 1:
                hasher = node_state()
                hasher.update(pop())
                hasher.update(h)
                h = hasher.digest()
                n >>= 1
                level += 1
                if level >= keep:
                    completed.append((level, n, h))
            push(h)
        self._size = size

    def root(self) -> bytes:
        return fold_right(self._hashes)

    def copy(self) -> Frontier:
        twin = Frontier(self._size, self._hashes)
        twin._keep = self._keep
        return twin

    def to_bytes(self) -> bytes:
        """u64 big-endian size, then the hashes largest first."""
        return self._size.to_bytes(8, "big") + b"".join(self._hashes)

    @classmethod
    def from_bytes(cls, data: bytes, *, keep_from_level: int | None = None) -> Frontier:
        if len(data) < 8:
            raise FrontierFormatError(f"frontier is {len(data)} bytes, shorter than its size field")
        size = int.from_bytes(data[:8], "big")
        body = data[8:]
        if len(body) != HASH_SIZE * size.bit_count():
            raise FrontierFormatError(
                f"frontier of size {size} needs {size.bit_count()} hashes, "
                f"got {len(body)} bytes of them"
            )
        hashes = [body[i : i + HASH_SIZE] for i in range(0, len(body), HASH_SIZE)]
        return cls(size, hashes, keep_from_level=keep_from_level)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frontier):
            return NotImplemented
        return self._size == other._size and self._hashes == other._hashes

    def __hash__(self) -> int:
        return hash((self._size, tuple(self._hashes)))

    def __repr__(self) -> str:
        return f"Frontier(size={self._size}, root={self.root().hex()})"


def root_of(leaves: Sequence[bytes]) -> bytes:
    """Merkle tree hash of a list of leaf hashes."""
    frontier = Frontier()
    frontier.extend(leaves)
    return frontier.root()


def inclusion_proof(index: int, size: int, range_hash: RangeHasher) -> list[bytes]:
    """RFC 6962 audit path for leaf `index` in the tree of `size` leaves, leaf to root."""
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is not in a tree of size {size}")
    path: list[bytes] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = split_point(hi - lo)
        if index < lo + k:
            path.append(range_hash(lo + k, hi))
            hi = lo + k
        else:
            path.append(range_hash(lo, lo + k))
            lo = lo + k
    path.reverse()
    return path


def consistency_proof(old_size: int, new_size: int, range_hash: RangeHasher) -> list[bytes]:
    """RFC 6962 consistency proof between tree sizes old_size <= new_size."""
    if not 0 <= old_size <= new_size:
        raise ProofError(f"no consistency proof from size {old_size} to {new_size}")
    if old_size in (0, new_size):
        return []
    path: list[bytes] = []
    m, lo, hi = old_size, 0, new_size
    complete = True
    while m != hi - lo:
        k = split_point(hi - lo)
        if m <= k:
            path.append(range_hash(lo + k, hi))
            hi = lo + k
        else:
            path.append(range_hash(lo, lo + k))
            m -= k
            lo += k
            complete = False
    if not complete:
        path.append(range_hash(lo, hi))
    path.reverse()
    return path


def root_from_inclusion_proof(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root that `proof` leads to from `leaf` (RFC 9162 section 2.1.3.2)."""
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is outside a tree of size {size}")
    if len(leaf) != HASH_SIZE or any(len(p) != HASH_SIZE for p in proof):
        raise ProofError("proof hashes and the leaf hash must be 32 bytes")
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        if sn == 0:
            raise ProofError("proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("proof is shorter than the tree is deep")
    return r


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> None:
    """Raise ProofError unless `proof` shows leaf `index` is in the tree with `root`."""
    if root_from_inclusion_proof(index, size, leaf, proof) != root:
        raise ProofError(f"inclusion proof for leaf {index} does not lead to the root")


def verify_consistency(
    old_size: int,
    new_size: int,
    old_root: bytes,
    new_root: bytes,
    proof: Sequence[bytes],
) -> None:
    """Raise ProofError unless `proof` shows the tree of old_size is a prefix of new_size's."""
    if not 0 <= old_size <= new_size:
        raise ProofError(f"tree size went from {old_size} to {new_size}")
    if old_size == new_size:
        if proof:
            raise ProofError("proof between equal sizes must be empty")
        if old_root != new_root:
            raise ProofError(f"two different roots for tree size {old_size}")
        return
    if old_size == 0:
        if proof:
            raise ProofError("proof from the empty tree must be empty")
        return
    if not proof:
        raise ProofError("empty consistency proof")
    if any(len(p) != HASH_SIZE for p in proof):
        raise ProofError("proof hashes must be 32 bytes")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("consistency proof is too short")
    if fr != old_root:
        raise ProofError(f"consistency proof does not lead to the root of size {old_size}")
    if sr != new_root:
        raise ProofError(f"consistency proof does not lead to the root of size {new_size}")
