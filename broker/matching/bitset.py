"""Sets of clause positions as Python integers (bit i set = clause i is in the set).

Python's big integers make good bitsets for the engine: ``&`` and ``|`` on a 100,000-bit set
cost a couple of microseconds with no call overhead, and a set can be a dict value. Turning a
set back into positions goes through numpy for large sets.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["from_mask", "from_positions", "position_array", "positions"]

# Peeling bits off one by one costs (set bits x size); numpy costs a fixed ~6 us plus the size.
_LOOP_WORK = 100_000


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
    if length <= 512 or bits.bit_count() * length <= _LOOP_WORK:
        out = []
        while bits:
            low = bits & -bits
            out.append(low.bit_length() - 1)
            bits ^= low
        return out
    result: list[int] = _decode(bits, length).tolist()
    return result


def position_array(bits: int) -> npt.NDArray[np.int64]:
    """The positions of the set bits, ascending, as a numpy array."""
    length = bits.bit_length()
    if length <= 512 or bits.bit_count() * length <= _LOOP_WORK:
        return np.array(positions(bits), dtype=np.int64)
    return _decode(bits, length)


def _decode(bits: int, length: int) -> npt.NDArray[np.int64]:
    words = np.frombuffer(bits.to_bytes((length + 63) // 64 * 8, "little"), dtype=np.uint64)
    nonzero = np.flatnonzero(words)
    unpacked = np.unpackbits(words[nonzero].view(np.uint8), bitorder="little")
    found = np.flatnonzero(unpacked)
    result: npt.NDArray[np.int64] = nonzero[found >> 6] * 64 + (found & 63)
    return result
