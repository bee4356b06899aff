"""Sets of clause positions as Python integers (bit i set = clause i is in the set).

Python's big integers make good bitsets for the engine: ``&`` and ``|`` on a 100,000-bit set
cost a couple of microseconds with no call overhead, and a set can be a dict value. Turning a
set back into positions goes through numpy for large sets.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["from_mask", "from_positions", "positions"]

_SMALL = 256  # below this many bits, a Python loop is faster than numpy


def from_mask(mask: npt.NDArray[np.bool_]) -> int:
    """The bitset whose bit i is ``mask[i]``."""
    if not mask.any():
        return 0
    return int.from_bytes(np.packbits(mask, bitorder="little").tobytes(), "little")


def from_positions(indices: npt.ArrayLike, size: int) -> int:
    """The bitset of the given positions (each below ``size``)."""
    mask = np.zeros(size, dtype=np.bool_)
    mask[np.asarray(indices, dtype=np.int64)] = True
    return from_mask(mask)


def positions(bits: int) -> list[int]:
    """The positions of the set bits, ascending."""
    if not bits:
        return []
    length = bits.bit_length()
    if length <= _SMALL:
        out = []
        while bits:
            low = bits & -bits
            out.append(low.bit_length() - 1)
            bits ^= low
        return out
    words = np.frombuffer(bits.to_bytes((length + 63) // 64 * 8, "little"), dtype=np.uint64)
    nonzero = np.flatnonzero(words)
    chosen = words[nonzero].view(np.uint8).reshape(-1, 8)
    unpacked = np.unpackbits(chosen, axis=1, bitorder="little")
    word_index, bit_index = np.nonzero(unpacked)
    result: list[int] = (nonzero[word_index] * 64 + bit_index).tolist()
    return result
