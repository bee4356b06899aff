"""Sets of clause positions as Python integers (bit i set = clause i is in the set).

Python's big integers make good bitsets for the engine: ``&`` and ``|`` on a 100,000-bit set
cost a couple of microseconds with no call overhead, and a set can be a dict value. Turning a
set back into positions goes through numpy for large sets.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["decode_many", "from_mask", "from_positions", "position_array", "positions"]

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
    nonzero = words.nonzero()[0]
    unpacked = np.unpackbits(words[nonzero].view(np.uint8), bitorder="little")
    found = unpacked.nonzero()[0]
    result: npt.NDArray[np.int64] = nonzero[found >> 6] * 64 + (found & 63)
    return result


def decode_many(sets: list[int], size: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The positions of many bitsets over ``size`` bits at once, in a few numpy passes.

    Returns ``(positions, bounds)``: the positions of ``sets[i]`` are
    ``positions[bounds[i]:bounds[i + 1]]`` (in no particular order). Sparse words are peeled
    one lowest bit at a time, all words together, instead of unpacking all 64 bits of each.
    """
    width = (size + 63) // 64
    buffer = b"".join([bits.to_bytes(width * 8, "little") for bits in sets])
    words = np.frombuffer(buffer, dtype=np.uint64)
    where = words.nonzero()[0]
    values = words[where]
    found_words: list[npt.NDArray[np.int64]] = []
    found_bits: list[npt.NDArray[np.int64]] = []
    while len(values):
        lowest = values & (~values + np.uint64(1))
        found_words.append(where)
        found_bits.append(np.log2(lowest.astype(np.float64)).astype(np.int64))
        values = values ^ lowest
        keep = values.nonzero()[0]
        values, where = values[keep], where[keep]
    if not found_words:
        return np.empty(0, dtype=np.int64), np.zeros(len(sets) + 1, dtype=np.int64)
    word = np.concatenate(found_words)
    bit = np.concatenate(found_bits)
    owner = word // width
    order = np.argsort(owner.astype(np.uint32), kind="stable")
    positions: npt.NDArray[np.int64] = ((word % width) * 64 + bit)[order]
    bounds: npt.NDArray[np.int64] = np.searchsorted(owner[order], np.arange(len(sets) + 1))
    return positions, bounds
