"""Vectors as the schema's `Part`s, batches cut to the master's bounds, and
the checks of what a caller passes in.

A vector travels as roaring-style containers (schema `Part`, docs/protocol.md
§5): bit ``b`` lives in the container with key ``b >> 16``; a container of
more than ``SPARSE_MAX`` bits is *dense* (1024 little-endian u64 words), a
smaller one *sparse* (its ascending u16 positions). These are the shapes the
bitfold engine keeps, so the master stores what it receives without
reshaping it.
"""

from dataclasses import dataclass
from typing import Iterable, List, Mapping, Tuple, Union

import numpy as np
from pyroaring import BitMap

from ._errors import Error

U64_MAX = 2**64 - 1

#: The most bits the engine keeps in a sparse container (its `SPARSE_MAX`).
SPARSE_MAX = 256

#: The most dense containers one `Part` may hold (the engine's `PART_MAX_DENSE`).
PART_MAX_DENSE = 32768

#: The most vectors one import or clear message may carry (docs/protocol.md §7).
MAX_MESSAGE_VECTORS = 1 << 18

#: About how many vector bytes one import or clear message carries, as the
#: Rust client cuts them (a single larger vector goes in a message of its own).
MESSAGE_BYTES = 64 << 20

#: The most spans one `delete` may carry (docs/protocol.md §7).
MAX_DELETE_SPANS = 1 << 16

WORDS_PER_CONTAINER = 1024


@dataclass
class Part:
    """One schema `Part`: its fields as little-endian bytes."""

    dense_keys: bytes
    dense_words: bytes
    sparse_keys: bytes
    sparse_ends: bytes
    sparse_values: bytes

    def size(self) -> int:
        """Its bytes on the wire, about."""
        return (
            len(self.dense_keys)
            + len(self.dense_words)
            + len(self.sparse_keys)
            + len(self.sparse_ends)
            + len(self.sparse_values)
        )


def vector_parts(bitmap: BitMap) -> List[Part]:
    """The parts of one vector: its containers in key order, cut into parts of
    at most `PART_MAX_DENSE` dense containers each (ascending, key-disjoint).
    An empty bitmap has no parts."""
    part_max_dense = PART_MAX_DENSE
    bits = np.asarray(bitmap.to_array(), dtype=np.uint32)
    if bits.size == 0:
        return []
    keys = bits >> 16
    cuts = np.flatnonzero(np.diff(keys)) + 1
    starts = np.concatenate(([0], cuts))
    counts = np.diff(np.concatenate((starts, [bits.size])))
    container_keys = keys[starts].astype("<u2")
    dense = counts > SPARSE_MAX

    # The dense containers' words: each set bit is one word's bit, and the
    # bits ascend, so a word is the sum of its bits' values.
    bit_dense = np.repeat(dense, counts)
    dense_bits = bits[bit_dense]
    ordinal = np.repeat(np.arange(int(dense.sum()), dtype=np.uint64), counts[dense])
    low = (dense_bits & 0xFFFF).astype(np.uint64)
    word = ordinal * WORDS_PER_CONTAINER + (low >> np.uint64(6))
    words = np.zeros(int(dense.sum()) * WORDS_PER_CONTAINER, dtype="<u8")
    if word.size:
        first = np.flatnonzero(np.concatenate(([True], word[1:] != word[:-1])))
        values = np.left_shift(np.uint64(1), low & np.uint64(63))
        words[word[first]] = np.add.reduceat(values, first)
    sparse_values = (bits[~bit_dense] & 0xFFFF).astype("<u2")

    # Part p holds the containers with p * part_max_dense dense ones before them.
    dense_before = np.cumsum(dense) - dense
    part_of = dense_before // part_max_dense
    dense_seen = np.concatenate(([0], np.cumsum(dense)))
    sparse_seen = np.concatenate(([0], np.cumsum(np.where(dense, 0, counts))))
    parts = []
    for p in range(int(part_of[-1]) + 1):
        lo, hi = np.searchsorted(part_of, [p, p + 1])
        in_part = slice(lo, hi)
        is_dense = dense[in_part]
        d0, d1 = dense_seen[lo], dense_seen[hi]
        s0, s1 = sparse_seen[lo], sparse_seen[hi]
        sparse_counts = counts[in_part][~is_dense]
        parts.append(
            Part(
                dense_keys=container_keys[in_part][is_dense].tobytes(),
                dense_words=words[d0 * WORDS_PER_CONTAINER : d1 * WORDS_PER_CONTAINER].tobytes(),
                sparse_keys=container_keys[in_part][~is_dense].tobytes(),
                sparse_ends=np.cumsum(sparse_counts).astype("<u4").tobytes(),
                sparse_values=sparse_values[s0:s1].tobytes(),
            )
        )
    return parts


def check_vid(vid) -> int:
    """`vid` as an int within u64, or a `badArgument` error naming it."""
    if isinstance(vid, bool) or not isinstance(vid, (int, np.integer)):
        raise Error("badArgument", f"a vid must be an int, not {type(vid).__name__} ({vid!r})")
    vid = int(vid)
    if not 0 <= vid <= U64_MAX:
        raise Error("badArgument", f"vid {vid} is outside 0..=2**64-1")
    return vid


VectorsArg = Union[Mapping[int, object], Iterable[Tuple[int, object]]]


def encode_vectors(vectors: VectorsArg) -> List[Tuple[int, List[Part]]]:
    """`{vid: BitMap}` (or `(vid, BitMap)` pairs; anything `BitMap()` takes
    in place of a `BitMap`) as `(vid, parts)`, empty vectors left out."""
    pairs = vectors.items() if isinstance(vectors, Mapping) else vectors
    encoded = []
    for pair in pairs:
        try:
            vid, bitmap = pair
        except (TypeError, ValueError):
            raise Error(
                "badArgument",
                f"vectors are given as {{vid: BitMap}} or (vid, BitMap) pairs, not {pair!r}",
            ) from None
        vid = check_vid(vid)
        if not isinstance(bitmap, BitMap):
            try:
                bitmap = BitMap(bitmap)
            except (TypeError, ValueError, OverflowError) as err:
                raise Error(
                    "badArgument",
                    f"the bits of vid {vid} are not a BitMap nor bit positions in 0..2**32: {err}",
                ) from None
        parts = vector_parts(bitmap)
        if parts:
            encoded.append((vid, parts))
    return encoded


def batches(encoded: List[Tuple[int, List[Part]]]) -> List[List[Tuple[int, List[Part]]]]:
    """`encoded` cut into messages of about `MESSAGE_BYTES` and at most
    `MAX_MESSAGE_VECTORS` vectors each."""
    messages: List[List[Tuple[int, List[Part]]]] = []
    current: List[Tuple[int, List[Part]]] = []
    size = 0
    for vid, parts in encoded:
        vector_size = sum(p.size() for p in parts) + 16
        if current and (size + vector_size > MESSAGE_BYTES or len(current) == MAX_MESSAGE_VECTORS):
            messages.append(current)
            current, size = [], 0
        current.append((vid, parts))
        size += vector_size
    if current:
        messages.append(current)
    return messages


def encode_spans(spans) -> List[Tuple[int, int]]:
    """`spans` (ints and `(first, last)` pairs, inclusive) as pairs. A pair
    whose first vid exceeds its last is the master's to refuse (`badQuery`)."""
    if isinstance(spans, (int, np.integer)) or (
        isinstance(spans, tuple) and len(spans) == 2 and all(isinstance(v, int) for v in spans)
    ):
        raise Error(
            "badArgument",
            f"delete takes a list of vids and (first, last) spans: write [{spans!r}]",
        )
    out = []
    for span in spans:
        if isinstance(span, (int, np.integer)) and not isinstance(span, bool):
            vid = check_vid(span)
            out.append((vid, vid))
            continue
        try:
            first, last = span
        except (TypeError, ValueError):
            raise Error(
                "badArgument", f"a span is a vid or a (first, last) pair, not {span!r}"
            ) from None
        out.append((check_vid(first), check_vid(last)))
    return out
