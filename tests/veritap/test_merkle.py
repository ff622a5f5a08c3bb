"""veritap.merkle against the RFC 6962 reference vectors and a naive recursive implementation."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap import merkle

# The Certificate Transparency reference leaves and tree heads (transparency-dev/merkle
# testonly/constants.go and proof/verify_test.go), used as data.
CT_LEAVES = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]
CT_ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
# (1-based leaf, tree size, audit path)
CT_INCLUSION = [
    (1, 1, []),
    (
        1,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        6,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (3, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (
        2,
        5,
        [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]
# (old size, new size, proof)
CT_CONSISTENCY = [
    (1, 1, []),
    (
        1,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        6,
        8,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (
        2,
        5,
        [
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
    (
        6,
        7,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
]


# --- the naive reference: RFC 6962 section 2.1, written from the definitions ---------------


def naive_mth(data: list[bytes]) -> bytes:
    if not data:
        return hashlib.sha256(b"").digest()
    if len(data) == 1:
        return hashlib.sha256(b"\x00" + data[0]).digest()
    k = 1
    while k * 2 < len(data):
        k *= 2
    return hashlib.sha256(b"\x01" + naive_mth(data[:k]) + naive_mth(data[k:])).digest()


def naive_path(m: int, data: list[bytes]) -> list[bytes]:
    if len(data) == 1:
        return []
    k = 1
    while k * 2 < len(data):
        k *= 2
    if m < k:
        return [*naive_path(m, data[:k]), naive_mth(data[k:])]
    return [*naive_path(m - k, data[k:]), naive_mth(data[:k])]


def naive_subproof(m: int, data: list[bytes], complete: bool) -> list[bytes]:
    n = len(data)
    if m == n:
        return [] if complete else [naive_mth(data)]
    k = 1
    while k * 2 < n:
        k *= 2
    if m <= k:
        return [*naive_subproof(m, data[:k], complete), naive_mth(data[k:])]
    return [*naive_subproof(m - k, data[k:], False), naive_mth(data[:k])]


def naive_consistency(m: int, data: list[bytes]) -> list[bytes]:
    return [] if m in (0, len(data)) else naive_subproof(m, data, True)


def range_hasher(data: list[bytes]) -> merkle.RangeHasher:
    return lambda begin, end: naive_mth(data[begin:end])


def unhex(hashes: list[str]) -> list[bytes]:
    return [bytes.fromhex(h) for h in hashes]


# --- reference vectors -----------------------------------------------------------------------


def test_roots_match_the_reference_tree_heads() -> None:
    leaves = [merkle.leaf_hash(d) for d in CT_LEAVES]
    frontier = merkle.Frontier()
    assert frontier.root().hex() == CT_ROOTS[0]
    for size in range(1, 9):
        frontier.append(leaves[size - 1])
        assert frontier.root().hex() == CT_ROOTS[size]
        assert merkle.root_of(leaves[:size]).hex() == CT_ROOTS[size]
        assert naive_mth(CT_LEAVES[:size]).hex() == CT_ROOTS[size]


@pytest.mark.parametrize(("leaf", "size", "path"), CT_INCLUSION)
def test_inclusion_vectors(leaf: int, size: int, path: list[str]) -> None:
    expected = unhex(path)
    got = merkle.inclusion_proof(leaf - 1, size, range_hasher(CT_LEAVES[:size]))
    assert got == expected
    root = bytes.fromhex(CT_ROOTS[size])
    leaf_hash = merkle.leaf_hash(CT_LEAVES[leaf - 1])
    merkle.verify_inclusion(leaf - 1, size, leaf_hash, expected, root)


@pytest.mark.parametrize(("old", "new", "proof"), CT_CONSISTENCY)
def test_consistency_vectors(old: int, new: int, proof: list[str]) -> None:
    expected = unhex(proof)
    assert merkle.consistency_proof(old, new, range_hasher(CT_LEAVES[:new])) == expected
    merkle.verify_consistency(
        old, new, bytes.fromhex(CT_ROOTS[old]), bytes.fromhex(CT_ROOTS[new]), expected
    )


def corrupted_inclusions(
    index: int, size: int, proof: list[bytes], root: bytes, leaf: bytes
) -> list[tuple[int, int, list[bytes], bytes, bytes]]:
    """The corruptions the CT test suite tries; every one must be rejected."""
    some = bytes.fromhex("abacaba000000000000000000000000000000000000000000060061e00123456")
    out = [
        (index - 1, size, proof, root, leaf),
        (index + 1, size, proof, root, leaf),
        (index ^ 2, size, proof, root, leaf),
        (index, size * 2, proof, root, leaf),
        (index, size // 2, proof, root, leaf),
        (index, size, proof, root, merkle.leaf_hash(b"WrongLeaf")),
        (index, size, proof, merkle.EMPTY_ROOT, leaf),
        (index, size, proof, some, leaf),
        (index, size, [*proof, root], root, leaf),
        (index, size, [root, *proof], root, leaf),
    ]
    for i in range(len(proof)):
        flipped = list(proof)
        flipped[i] = bytes([flipped[i][0] ^ 8]) + flipped[i][1:]
        out.append((index, size, flipped, root, leaf))
    if proof:
        out.append((index, size, proof[:-1], root, leaf))
    if len(proof) > 1:
        out.append((index, size, [proof[0], some, *proof[1:]], root, leaf))
    return out


@pytest.mark.parametrize(("leaf", "size", "path"), CT_INCLUSION[1:])
def test_corrupted_inclusion_proofs_are_rejected(leaf: int, size: int, path: list[str]) -> None:
    root = bytes.fromhex(CT_ROOTS[size])
    leaf_hash = merkle.leaf_hash(CT_LEAVES[leaf - 1])
    for index, tree_size, proof, wrong_root, wrong_leaf in corrupted_inclusions(
        leaf - 1, size, unhex(path), root, leaf_hash
    ):
        with pytest.raises(merkle.ProofError):
            merkle.verify_inclusion(index, tree_size, wrong_leaf, proof, wrong_root)


@pytest.mark.parametrize(("old", "new", "proof"), CT_CONSISTENCY[1:])
def test_corrupted_consistency_proofs_are_rejected(old: int, new: int, proof: list[str]) -> None:
    root1, root2 = bytes.fromhex(CT_ROOTS[old]), bytes.fromhex(CT_ROOTS[new])
    good = unhex(proof)
    cases = [
        (old - 1, new, root1, root2, good),
        (old + 1, new, root1, root2, good),
        (old ^ 2, new, root1, root2, good),
        (old, new * 2, root1, root2, good),
        (old, new // 2, root1, root2, good),
        (old, new, merkle.EMPTY_ROOT, root2, good),
        (old, new, root1, merkle.EMPTY_ROOT, good),
        (old, new, root2, root1, good),
        (old, new, root1, root2, []),
        (old, new, root1, root2, [*good, root1]),
        (old, new, root1, root2, [root2, *good]),
        (old, new, root1, root2, [good[0], *good]),
        (old, new, root1, root2, good[:-1]),
    ]
    for i in range(len(good)):
        flipped = list(good)
        flipped[i] = bytes([flipped[i][0] ^ 16]) + flipped[i][1:]
        cases.append((old, new, root1, root2, flipped))
    for size1, size2, r1, r2, p in cases:
        with pytest.raises(merkle.ProofError):
            merkle.verify_consistency(size1, size2, r1, r2, p)


def test_trivial_consistency_cases() -> None:
    some = merkle.leaf_hash(b"x")
    merkle.verify_consistency(0, 0, some, some, [])
    merkle.verify_consistency(0, 5, some, merkle.EMPTY_ROOT, [])
    with pytest.raises(merkle.ProofError):
        merkle.verify_consistency(1, 1, some, merkle.EMPTY_ROOT, [])
    with pytest.raises(merkle.ProofError):
        merkle.verify_consistency(2, 1, some, some, [])
    with pytest.raises(merkle.ProofError):
        merkle.verify_consistency(1, 1, some, some, [some])


# --- against the naive implementation ----------------------------------------------------------

leaf_data = st.lists(st.binary(max_size=12), min_size=1, max_size=70)


@given(leaf_data)
def test_frontier_root_is_the_naive_root_at_every_size(data: list[bytes]) -> None:
    frontier = merkle.Frontier(keep_from_level=1)
    for size, item in enumerate(data, 1):
        frontier.append(merkle.leaf_hash(item))
        assert frontier.root() == naive_mth(data[:size])
    # Every completed perfect subtree was reported with the naive hash of its leaves.
    for level, index, node in frontier.completed:
        assert node == naive_mth(data[index << level : (index + 1) << level])
    assert len(frontier.completed) == sum(len(data) >> level for level in range(1, 8))


@given(leaf_data, st.lists(st.integers(min_value=0, max_value=9), min_size=1))
def test_extending_in_chunks_is_appending_leaf_by_leaf(data: list[bytes], cuts: list[int]) -> None:
    """`extend` over chunks of any size, from frontiers of any size (the log's batches),
    gives what single appends give: hashes, size, completed subtrees, naive root."""
    leaves = [merkle.leaf_hash(item) for item in data]
    one_by_one = merkle.Frontier(keep_from_level=1)
    for leaf in leaves:
        one_by_one.append(leaf)
    chunked = merkle.Frontier(keep_from_level=1)
    start = 0
    for cut in cuts * len(leaves):
        chunked.extend(leaves[start : start + cut])
        start += cut
        if start >= len(leaves):
            break
    chunked.extend(leaves[start:])
    assert chunked == one_by_one
    assert chunked.completed == one_by_one.completed
    assert chunked.root() == naive_mth(data)


@given(leaf_data, st.data())
def test_inclusion_proofs_match_naive_and_verify(data: list[bytes], draw: st.DataObject) -> None:
    size = draw.draw(st.integers(1, len(data)))
    index = draw.draw(st.integers(0, size - 1))
    tree = data[:size]
    proof = merkle.inclusion_proof(index, size, range_hasher(tree))
    assert proof == naive_path(index, tree)
    merkle.verify_inclusion(index, size, merkle.leaf_hash(tree[index]), proof, naive_mth(tree))


@given(leaf_data, st.data())
def test_consistency_proofs_match_naive_and_verify(data: list[bytes], draw: st.DataObject) -> None:
    new = draw.draw(st.integers(1, len(data)))
    old = draw.draw(st.integers(0, new))
    proof = merkle.consistency_proof(old, new, range_hasher(data[:new]))
    assert proof == naive_consistency(old, data[:new])
    merkle.verify_consistency(old, new, naive_mth(data[:old]), naive_mth(data[:new]), proof)


@given(st.integers(0, 5000), st.integers(0, 5000))
def test_perfect_subtrees_tile_the_range(a: int, b: int) -> None:
    begin, end = min(a, b), max(a, b)
    pos = begin
    for level, index in merkle.perfect_subtrees(begin, end):
        assert index << level == pos
        pos += 1 << level
    assert pos == end


@settings(max_examples=50)
@given(st.lists(st.binary(min_size=32, max_size=32), max_size=40))
def test_frontier_bytes_round_trip(leaves: list[bytes]) -> None:
    frontier = merkle.Frontier()
    frontier.extend(leaves)
    again = merkle.Frontier.from_bytes(frontier.to_bytes())
    assert again == frontier
    assert again.root() == frontier.root()


@given(st.binary(max_size=200))
def test_frontier_from_arbitrary_bytes_fails_cleanly(data: bytes) -> None:
    try:
        frontier = merkle.Frontier.from_bytes(data)
    except merkle.FrontierFormatError:
        return
    assert frontier.to_bytes() == data


def test_proof_parameters_are_checked() -> None:
    with pytest.raises(merkle.ProofError):
        merkle.inclusion_proof(3, 3, range_hasher([b"a", b"b", b"c"]))
    with pytest.raises(merkle.ProofError):
        merkle.consistency_proof(4, 3, range_hasher([b"a", b"b", b"c"]))
    with pytest.raises(merkle.ProofError):
        merkle.verify_inclusion(0, 1, b"short", [], b"short")
