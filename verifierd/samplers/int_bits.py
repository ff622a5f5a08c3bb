"""Unsigned 32- and 64-bit integer arithmetic on torch int64 tensors.

torch has no full uint64/uint32 arithmetic on every device, but int64 add and
multiply wrap modulo 2**64 (two's complement), which is exactly uint64
arithmetic on the bit patterns. Only right shifts differ (arithmetic, not
logical) and are masked here. 32-bit values live in the low half of int64 and
are masked after every operation that can carry out of it.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF


def u64(value: int) -> int:
    """A uint64 constant as the int64 with the same bit pattern."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def shr64(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 tensors that hold uint64 bit patterns."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for x in [0, 2**32)."""
    return (x * constant) & MASK32


def rotl32(x: torch.Tensor, shift: int) -> torch.Tensor:
    """32-bit rotate left of x in [0, 2**32)."""
    return ((x << shift) | (x >> (32 - shift))) & MASK32
