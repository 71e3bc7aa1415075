"""Natural keys: each table's index from a key (sparse int64 or UTF-8 string) to its row,
and the stable hash that places a key on a node (contract §2).

Schedulers and kernels work on dense rows only; a chunk's key columns are turned into rows
before it is handed to the team, in ``ts`` order, so a new key gets the next free row in
the order the stream first names it, whatever runs the chunk. An index is an open-addressing
hash table of ``row + 1`` (0: free slot) over the keys held in row order: for int64 keys
the values, for strings their bytes and offsets, so it costs the key bytes plus 16 to 32
bytes a key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from txstream.config import KEY_TYPES
from txstream.errors import RuntimeFailure, SchemaError, UsageError
from txstream.state._numba import inline, jit

DENSE, INT64, STRING = KEY_TYPES
"""Key types of a table: dense rows ``0..K-1`` (the key is the row), any int64, UTF-8."""
NATURAL = (INT64, STRING)
LIVE = "_live"
"""The column of a table of natural keys that is 1 where a key exists (contract §2)."""
KEYS_PREFIX = "keys-"
"""Names of the arrays of key indexes in a checkpoint (`StreamKeys.arrays`)."""
MISSING, FULL, UNKNOWN, NULL = -1, -2, -3, -4
"""Rows the kernels give a key that is not in the index (or malformed), one that did not
fit (`--max-keys`), a dictionary entry not looked up yet, a null key."""
NO_BITS = np.zeros(0, np.uint8)
"""The validity bitmap of an array without nulls."""
DICTIONARIES = 8
"""String dictionaries whose rows an index keeps (a source's, used again by later chunks)."""
LOAD = 0.7
MOVE_STEP = 1 << 17
"""Rows of the old slots a call puts into the new ones, at least, while the slots double."""
NO_SLOTS = np.zeros(1, np.int64)
"""The old slots when none are being taken over: a probe there finds nothing at once."""
"""Largest share of used slots before the slots double."""


# ---------------------------------------------------------------- hashing
@inline
def _mix(x):
    """A fixed 64-bit finaliser (splitmix64): every bit of the key moves every bit."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@inline
def _hash_int(key):
    return _mix(np.uint64(key))


@inline
def _hash_bytes(data, start, end):
    """FNV-1a over the bytes, finalised by `_mix`."""
    h = np.uint64(0xCBF29CE484222325)
    for i in range(start, end):
        h = (h ^ np.uint64(data[i])) * np.uint64(0x100000001B3)
    return _mix(h)


@jit
def _hash_ints(keys, out):
    for i in range(len(keys)):
        out[i] = _hash_int(keys[i])


@jit
def _hash_strings(offsets, data, out):
    for i in range(len(out)):
        out[i] = _hash_bytes(data, offsets[i], offsets[i + 1])


def key_hash(keys: pa.Array | np.ndarray) -> np.ndarray:
    """A stable 64-bit hash of every key (int64 values, or the UTF-8 bytes of strings):
    the same in every process and on every host, unlike Python's salted ``hash``."""
    out = np.empty(len(keys), np.uint64)
    if isinstance(keys, np.ndarray) or pa.types.is_integer(keys.type):
        _hash_ints(np.ascontiguousarray(keys, np.int64), out)
    else:
        offsets, data = _string_buffers(_conformed(keys, STRING, "keys"))
        _hash_strings(offsets, data, out)
    return out


def node_of(keys: pa.Array | np.ndarray, nodes: int) -> np.ndarray:
    """The node (``0..nodes-1``) that owns every key: `key_hash` modulo ``nodes``."""
    return (key_hash(keys) % np.uint64(nodes)).astype(np.int64)


# ---------------------------------------------------------------- kernels
# A slot holds ``tag | (row + 1)``: the high bits of the key's hash above the row, so that
# a probe past other keys rarely reads them (a cache miss each); 0 is a free slot.
LOW = (1 << 32) - 1
"""The bits of a slot that hold ``row + 1``: a table holds fewer than 2^32 - 1 keys."""


@inline
def _tag(hashed):
    return np.int64(hashed >> np.uint64(33)) << 32


@inline
def _row(slot):
    return (slot & LOW) - 1


@inline
def _probe_int(slots, keys_by_row, key, hashed):
    """The slot of ``key`` (of hash ``hashed``), or the free slot where it would go."""
    mask = len(slots) - 1
    tag = _tag(hashed)
    h = np.int64(hashed & np.uint64(mask))
    while slots[h] != 0:
        if slots[h] - (slots[h] & LOW) == tag and keys_by_row[_row(slots[h])] == key:
            break
        h = (h + 1) & mask
    return h


@inline
def _same(data, start, end, key_offsets, key_bytes, row):
    a, b = key_offsets[row], key_offsets[row + 1]
    if b - a != end - start:
        return False
    for i in range(end - start):
        if key_bytes[a + i] != data[start + i]:
            return False
    return True


@inline
def _probe_bytes(slots, key_offsets, key_bytes, data, start, end, hashed):
    mask = len(slots) - 1
    tag = _tag(hashed)
    h = np.int64(hashed & np.uint64(mask))
    while slots[h] != 0:
        if slots[h] - (slots[h] & LOW) == tag and _same(
            data, start, end, key_offsets, key_bytes, _row(slots[h])
        ):
            break
        h = (h + 1) & mask
    return h


@inline
def _is_valid(valid, offset, i):
    """Bit ``offset + i`` of a validity bitmap (an empty one: every value is valid)."""
    if len(valid) == 0:
        return True
    return (valid[(offset + i) >> 3] >> ((offset + i) & 7)) & 1 == 1


@jit
def _gather(entry, valid, offset, entry_rows, out):
    """``out[i]``: the row of entry ``entry[i]`` of a dictionary (NULL where null); the
    number of entries not looked up yet (UNKNOWN)."""
    unknown = 0
    for i in range(len(out)):
        if _is_valid(valid, offset, i):
            out[i] = entry_rows[entry[i]]
            unknown += out[i] == UNKNOWN
        else:
            out[i] = NULL
    return unknown


@jit
def _find_ints(slots, old, keys_by_row, keys, valid, offset, out):
    for i in range(len(keys)):
        if not _is_valid(valid, offset, i):
            out[i] = NULL
            continue
        hashed = _hash_int(keys[i])
        slot = slots[_probe_int(slots, keys_by_row, keys[i], hashed)]
        if slot == 0:  # not there, or not moved from the old slots yet (`KeyIndex._move`)
            slot = old[_probe_int(old, keys_by_row, keys[i], hashed)]
        out[i] = _row(slot)


@jit
def _add_ints(slots, old, keys_by_row, count, limit, keys, out):
    """Rows of ``keys`` in order, each missing one added at the next row (FULL past
    ``limit`` rows); returns the new count."""
    for i in range(len(keys)):
        hashed = _hash_int(keys[i])
        h = _probe_int(slots, keys_by_row, keys[i], hashed)
        slot = slots[h]
        if slot == 0:
            slot = old[_probe_int(old, keys_by_row, keys[i], hashed)]
        if slot == 0:
            if count == limit:
                out[i] = FULL
                continue
            keys_by_row[count] = keys[i]
            count += 1
            slot = slots[h] = _tag(hashed) | count
        out[i] = _row(slot)
    return count


@jit
def _find_strings(slots, old, key_offsets, key_bytes, offsets, data, out):
    for i in range(len(out)):
        start, end = offsets[i], offsets[i + 1]
        hashed = _hash_bytes(data, start, end)
        slot = slots[_probe_bytes(slots, key_offsets, key_bytes, data, start, end, hashed)]
        if slot == 0:
            slot = old[_probe_bytes(old, key_offsets, key_bytes, data, start, end, hashed)]
        out[i] = _row(slot) if end > start else MISSING


@jit
def _add_strings(slots, old, key_offsets, key_bytes, count, limit, offsets, data, out):
    """As `_add_ints`, for strings (an empty one is malformed: MISSING, not added)."""
    for i in range(len(out)):
        start, end = offsets[i], offsets[i + 1]
        if end == start:
            out[i] = MISSING
            continue
        hashed = _hash_bytes(data, start, end)
        h = _probe_bytes(slots, key_offsets, key_bytes, data, start, end, hashed)
        slot = slots[h]
        if slot == 0:
            slot = old[_probe_bytes(old, key_offsets, key_bytes, data, start, end, hashed)]
        if slot == 0:
            if count == limit:
                out[i] = FULL
                continue
            used = key_offsets[count]
            for j in range(end - start):
                key_bytes[used + j] = data[start + j]
            key_offsets[count + 1] = used + end - start
            count += 1
            slot = slots[h] = _tag(hashed) | count
        out[i] = _row(slot)
    return count


@jit
def _move_ints(slots, keys_by_row, first, end):
    """Put the keys of rows ``first..end-1`` into ``slots`` (read in row order: no misses
    but the slots' own)."""
    for row in range(first, end):
        hashed = _hash_int(keys_by_row[row])
        slots[_probe_int(slots, keys_by_row, keys_by_row[row], hashed)] = _tag(hashed) | (row + 1)


@jit
def _move_strings(slots, key_offsets, key_bytes, first, end):
    for row in range(first, end):
        start, stop = key_offsets[row], key_offsets[row + 1]
        hashed = _hash_bytes(key_bytes, start, stop)
        h = _probe_bytes(slots, key_offsets, key_bytes, key_bytes, start, stop, hashed)
        slots[h] = _tag(hashed) | (row + 1)


# ---------------------------------------------------------------- the index
class KeyIndex:
    """The rows of one table's natural keys (module docstring); at most ``limit`` keys."""

    def __init__(self, table: str, key_type: str, limit: int):
        if key_type not in NATURAL:
            raise ValueError(f"a key index holds int64 or string keys, not {key_type!r}")
        if limit >= LOW:
            raise UsageError(f"--max-keys must be below {LOW}")
        self.table, self.key_type, self.limit = table, key_type, limit
        self.count = 0
        self._slots = np.zeros(16, np.int64)
        self._old = NO_SLOTS
        """The slots `_slots` are taking over, a `MOVE_STEP` of rows a call (`_reserve`)."""
        self._moved = self._moving = 0
        """Rows put into `_slots` so far, of the first `_moving` (the old slots' keys)."""
        self._keys = np.zeros(16, np.int64)
        """int64 keys by row, or string offsets (``count + 1`` used)."""
        self._bytes = np.zeros(64 if key_type == STRING else 0, np.uint8)
        self._dictionaries: list[tuple[pa.Array, np.ndarray]] = []
        """The last few string dictionaries and the rows of their entries (`_entry_rows`)."""

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_dictionaries": []}

    def __setstate__(self, state: dict) -> None:
        # arrays unpickled from Ray's object store are read-only views of it
        self.__dict__.update(
            {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in state.items()}
        )

    def __len__(self) -> int:
        return self.count

    @property
    def nbytes(self) -> int:
        """Memory the index holds."""
        return self._slots.nbytes + self._old.nbytes + self._keys.nbytes + self._bytes.nbytes

    def add_init(self, keys: pa.Array, label: str) -> None:
        """Rows ``0..len(keys)-1`` for an init state's ``keys``; SchemaError if one is
        null, empty, of another type or there twice."""
        keys = _conformed(keys, self.key_type, label)
        if keys.null_count:
            raise SchemaError(f"{label}: column 'key' has nulls")
        before = self.count
        rows = self._add(keys)
        if (rows == MISSING).any():
            raise SchemaError(f"{label}: an empty string is not a key")
        if (rows == FULL).any():
            raise SchemaError(f"{label}: more than {self.limit} keys (--max-keys)")
        if self.count - before != len(keys):
            raise SchemaError(f"{label}: a key appears twice")

    def rows(self, columns: list[pa.ChunkedArray | pa.Array]) -> list[pa.ChunkedArray]:
        """The rows of the keys in ``columns`` (of one chunk, in ``ts`` order), as int64
        columns with the same nulls and chunks; a missing key is given the next row in the
        order of first appearance, event by event and, within an event, column by column.
        A malformed key (an empty string) gets -1. RuntimeFailure past `limit` keys.
        Strings are looked up once per distinct string (per dictionary entry)."""
        looked = [self._look_up(column) for column in columns]
        if any(len(column.missing) for column in looked):
            positions = [column.missing for column in looked]
            order = np.argsort(
                np.concatenate([m * len(looked) + i for i, m in enumerate(positions)]),
                kind="stable",
            )
            keys = pa.concat_arrays([column.keys() for column in looked])
            added = self._add(keys.take(pa.array(order)))
            if (added == FULL).any():
                raise RuntimeFailure(
                    f"table {self.table!r}: more than {self.limit} keys (--max-keys {self.limit})"
                )
            rows_in_order = np.empty(len(order), np.int64)
            rows_in_order[order] = added
            start = 0
            for column in looked:
                column.found(rows_in_order[start : start + len(column.missing)])
                start += len(column.missing)
        return [column.arrow() for column in looked]

    def _look_up(self, column: pa.ChunkedArray | pa.Array) -> _Looked:
        """The rows of one key column's keys that the index holds (MISSING for others)."""
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        looked = _Looked(chunks, self.key_type)
        for i, piece in enumerate(chunks):
            rows = looked.piece(i)
            value_type = piece.type.value_type if pa.types.is_dictionary(piece.type) else piece.type
            if pa.types.is_null(value_type):
                rows[:] = NULL
            elif self.key_type == INT64:
                keys = _conformed(piece, INT64, "events")
                _find_ints(
                    self._slots, self._old, self._keys, _ints(keys), *_validity_bits(keys), rows
                )
                looked.note_missing(i, keys)
            else:
                encoded = _dictionary_encoded(piece)
                valid, offset = _validity_bits(encoded)
                entries = encoded.dictionary
                entry = np.frombuffer(encoded.indices.buffers()[1], np.int32)
                entry = entry[encoded.offset : encoded.offset + len(encoded)]
                cached = self._entry_rows(entries)
                if _gather(entry, valid, offset, cached, rows):  # entries not looked up yet
                    wanted = np.zeros(len(entries), bool)
                    wanted[entry[rows == UNKNOWN]] = True
                    wanted = np.flatnonzero(wanted)
                    cached[wanted] = self.find(entries.take(pa.array(wanted)))
                    _gather(entry, valid, offset, cached, rows)
                looked.note_missing(i, entries, entry, cached)
        return looked

    def _entry_rows(self, entries: pa.Array) -> np.ndarray:
        """The rows of a dictionary's entries, UNKNOWN where not looked up yet. A source's
        dictionary serves several chunks (a Parquet row group's, copied into each batch
        read): rows found for it are kept, since a key's row never changes. Comparing a
        dictionary with a known one is a memory comparison, hashing its strings is not."""
        for known, rows in self._dictionaries:
            if len(known) == len(entries) and known.equals(entries):
                return rows
        rows = np.full(len(entries), UNKNOWN, np.int64)
        self._dictionaries = [(entries, rows), *self._dictionaries[: DICTIONARIES - 1]]
        return rows

    def find(self, keys: pa.Array) -> np.ndarray:
        """The row of every key, MISSING if it has none (or is null or malformed)."""
        keys = _conformed(keys, self.key_type, "keys")
        out = np.empty(len(keys), np.int64)
        if self.key_type == INT64:
            _find_ints(self._slots, self._old, self._keys, _ints(keys), *_validity_bits(keys), out)
        else:
            buffers = _string_buffers(keys)
            _find_strings(self._slots, self._old, self._keys, self._bytes, *buffers, out)
        out[~_valid(keys)] = MISSING
        return out

    def keys(self, rows: np.ndarray | None = None) -> pa.Array:
        """The natural keys of ``rows`` (default: every row, in row order)."""
        n = self.count
        if self.key_type == INT64:
            every = pa.array(self._keys[:n].copy())
        else:
            offsets = self._keys[: n + 1].copy()
            data = self._bytes[: offsets[-1]].copy()
            every = pa.LargeStringArray.from_buffers(
                n, pa.py_buffer(offsets), pa.py_buffer(data)
            ).cast(pa.string())
        return every if rows is None else every.take(pa.array(rows, pa.int64()))

    def arrays(self) -> dict[str, np.ndarray]:
        """The keys in row order as plain arrays (copies), for a checkpoint: ``keys``
        (int64), or ``offsets`` and ``bytes`` (strings)."""
        if self.key_type == INT64:
            return {"keys": self._keys[: self.count].copy()}
        offsets = self._keys[: self.count + 1].copy()
        return {"offsets": offsets, "bytes": self._bytes[: offsets[-1]].copy()}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """The keys of `arrays` (a checkpoint's), as rows 0..n-1 (the index must be empty)."""
        if self.key_type == INT64:
            keys = pa.array(arrays["keys"])
        else:
            offsets, data = arrays["offsets"], arrays["bytes"]
            keys = pa.LargeStringArray.from_buffers(
                len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data)
            )
        self.add_init(keys, f"checkpoint keys of {self.table!r}")

    def _add(self, keys: pa.Array) -> np.ndarray:
        """Rows of ``keys`` (valid ones), adding the missing ones in order."""
        keys = _conformed(keys, self.key_type, "keys")
        self._reserve(len(keys), _string_bytes(keys) if self.key_type == STRING else 0)
        out = np.empty(len(keys), np.int64)
        if self.key_type == INT64:
            self.count = _add_ints(
                self._slots, self._old, self._keys, self.count, self.limit, _ints(keys), out
            )
        else:
            offsets, data = _string_buffers(keys)
            self.count = _add_strings(
                self._slots,
                self._old,
                self._keys,
                self._bytes,
                self.count,
                self.limit,
                offsets,
                data,
                out,
            )
        return out

    def _reserve(self, keys: int, key_bytes: int) -> None:
        """Room for ``keys`` more keys of ``key_bytes`` bytes: arrays grow to a quarter more
        than needed; past `LOAD`, the slots double, taking the old ones' keys over a few
        calls (`_move`)."""
        wanted = min(self.count + keys, self.limit) + 1
        if wanted > len(self._keys):
            self._keys = _grown(self._keys, wanted)
        if self.key_type == STRING:
            used = int(self._keys[self.count])
            if used + key_bytes > len(self._bytes):
                self._bytes = _grown(self._bytes, used + key_bytes)
        if wanted > LOAD * len(self._slots):
            self._move(self._moving)  # the last doubling's move is done first
            slots = len(self._slots)
            while wanted > LOAD * slots:
                slots *= 2
            self._old, self._slots = self._slots, np.zeros(slots, np.int64)
            self._moved, self._moving = 0, self.count
        # the next doubling comes once as many keys were added as the old slots held:
        # moving two rows per key added finishes first
        self._move(max(MOVE_STEP, 2 * keys))

    def _move(self, step: int) -> None:
        """Put the next ``step`` rows of the old slots into the slots: a doubling costs
        each chunk a share, not one chunk all of it (the old slots are looked in
        meanwhile, and keep every key they had)."""
        end = min(self._moved + step, self._moving)
        if self._moved < end:
            if self.key_type == INT64:
                _move_ints(self._slots, self._keys, self._moved, end)
            else:
                _move_strings(self._slots, self._keys, self._bytes, self._moved, end)
        self._moved = end
        if end == self._moving:
            self._old = NO_SLOTS


def _grown(array: np.ndarray, wanted: int) -> np.ndarray:
    bigger = np.zeros(max(wanted + wanted // 4, 16), array.dtype)
    bigger[: len(array)] = array
    return bigger


class _Looked:
    """One key column of a chunk while `KeyIndex.rows` turns it into rows: the rows of
    its pieces (Arrow chunks) end to end, and its missing keys, which get theirs."""

    def __init__(self, chunks: list[pa.Array], key_type: str):
        self.chunks, self.key_type = chunks, key_type
        self.starts = np.cumsum([0, *(len(c) for c in chunks)])
        self.rows = np.empty(int(self.starts[-1]), np.int64)
        self._missing: list[np.ndarray] = []
        self._keys: list[pa.Array] = []
        self._entries: list[tuple[np.ndarray, np.ndarray]] = []

    def piece(self, i: int) -> np.ndarray:
        """The rows of chunk ``i``."""
        return self.rows[self.starts[i] : self.starts[i + 1]]

    def note_missing(
        self,
        i: int,
        keys: pa.Array,
        entry: np.ndarray | None = None,
        cached: np.ndarray | None = None,
    ) -> None:
        """Note the missing keys of chunk ``i``: its ``keys``, or its dictionary ``keys``
        with the ``entry`` of every event and the ``cached`` rows of its entries."""
        local = np.flatnonzero(self.piece(i) == MISSING)
        if not len(local):
            return
        self._missing.append(local + self.starts[i])
        at = local if entry is None else entry[local]
        self._keys.append(_conformed(keys.take(pa.array(at)), self.key_type, "events"))
        if entry is not None:
            self._entries.append((cached, entry[local]))

    @cached_property
    def missing(self) -> np.ndarray:
        """Positions of the missing keys, in order."""
        return np.concatenate(self._missing) if self._missing else np.zeros(0, np.int64)

    def keys(self) -> pa.Array:
        """The missing keys, in order."""
        if not self._keys:
            return pa.array([], pa.int64() if self.key_type == INT64 else pa.large_string())
        return pa.concat_arrays(self._keys)

    def found(self, rows: np.ndarray) -> None:
        """The rows the missing keys were given (kept for their dictionary entries too)."""
        self.rows[self.missing] = rows
        start = 0
        for cached, entries in self._entries:
            given = rows[start : start + len(entries)]
            cached[entries[given >= 0]] = given[given >= 0]
            start += len(entries)

    def arrow(self) -> pa.ChunkedArray:
        """The rows as int64 chunks with the column's nulls."""
        out = []
        for i, chunk in enumerate(self.chunks):
            valid, offset = _validity_bits(chunk)
            data = np.empty(offset + len(chunk), np.int64)
            data[offset:] = self.piece(i)
            bitmap = chunk.buffers()[0] if len(valid) else None
            buffers = [bitmap, pa.py_buffer(data)]
            out.append(pa.Array.from_buffers(pa.int64(), len(chunk), buffers, offset=offset))
        return pa.chunked_array(out, pa.int64())


# ---------------------------------------------------------------- Arrow columns
def _validity_bits(array: pa.Array) -> tuple[np.ndarray, int]:
    """(validity bitmap, offset of the array's first bit) of an array; an empty bitmap
    when it has no nulls."""
    if array.null_count == 0 or pa.types.is_null(array.type):
        return NO_BITS, 0
    return np.frombuffer(array.buffers()[0], np.uint8), array.offset


def _dictionary_encoded(column: pa.ChunkedArray | pa.Array) -> pa.DictionaryArray:
    """A string key column as one dictionary array (its chunks' dictionaries unified);
    SchemaError if it holds no strings."""
    chunks = column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column])
    value_type = chunks.type.value_type if pa.types.is_dictionary(chunks.type) else chunks.type
    if pa.types.is_null(value_type):
        return pa.DictionaryArray.from_arrays(
            pa.nulls(len(chunks), pa.int32()), pa.array([], pa.string())
        )
    if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)):
        raise SchemaError(f"events: key of type {value_type}, expected string")
    if not pa.types.is_dictionary(chunks.type):
        chunks = pc.dictionary_encode(chunks)
    if chunks.num_chunks == 0:
        return pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array([], pa.string()))
    if chunks.num_chunks > 1:
        chunks = chunks.unify_dictionaries()
    encoded = pa.concat_arrays(chunks.chunks) if chunks.num_chunks > 1 else chunks.chunk(0)
    if encoded.indices.type != pa.int32():
        encoded = pa.DictionaryArray.from_arrays(
            encoded.indices.cast(pa.int32()), encoded.dictionary
        )
    return encoded


def _conformed(keys: pa.Array | pa.ChunkedArray, key_type: str, label: str) -> pa.Array:
    """``keys`` (any array, chunked or dictionary-encoded) as one int64 or large_string
    array; SchemaError if they are of another kind."""
    if not isinstance(keys, pa.Array | pa.ChunkedArray):
        keys = pa.array(keys)
    chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
    value_type = keys.type.value_type if pa.types.is_dictionary(keys.type) else keys.type
    if pa.types.is_null(value_type):
        return pa.nulls(len(keys), pa.int64() if key_type == INT64 else pa.large_string())
    if key_type == INT64 and not pa.types.is_integer(value_type):
        raise SchemaError(f"{label}: key of type {value_type}, expected int64")
    if key_type == STRING and not (
        pa.types.is_string(value_type) or pa.types.is_large_string(value_type)
    ):
        raise SchemaError(f"{label}: key of type {value_type}, expected string")
    wanted = pa.int64() if key_type == INT64 else pa.large_string()
    if len(chunks) == 1 and chunks[0].type == wanted:
        return chunks[0]
    chunks = [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in chunks]
    plain = [c.cast(wanted) for c in chunks]
    return pa.concat_arrays(plain) if plain else pa.array([], wanted)


def _ints(keys: pa.Array) -> np.ndarray:
    """The values of an int64 array, without copying them (a null's value is whatever its
    slot holds: `find` says MISSING for nulls, `rows` keeps them null)."""
    if not len(keys):
        return np.zeros(0, np.int64)
    return np.frombuffer(keys.buffers()[1], np.int64)[keys.offset : keys.offset + len(keys)]


def _valid(keys: pa.Array) -> np.ndarray:
    if keys.null_count == 0:
        return np.ones(len(keys), bool)
    return keys.is_valid().to_numpy(zero_copy_only=False)


def _string_buffers(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Offsets (int64, one more than keys) and bytes of a large_string array."""
    buffers = keys.buffers()
    offsets = np.frombuffer(buffers[1], np.int64)[keys.offset : keys.offset + len(keys) + 1]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return np.ascontiguousarray(offsets), data


def _string_bytes(keys: pa.Array) -> int:
    offsets, _ = _string_buffers(keys)
    return int(offsets[-1] - offsets[0]) if len(offsets) else 0


# ---------------------------------------------------------------- a stream's keys
class StreamKeys:
    """Every table's key index and the event columns that carry its keys (a topology's
    ``key_columns``): what turns a chunk's keys into rows, and a query's keys back."""

    def __init__(self, indexes: dict[str, KeyIndex], columns: dict[str, str]):
        self.indexes = indexes
        self.columns = columns
        self._lock = threading.Lock()
        """Held while a chunk adds keys: a query from another thread reads them."""

    def __getstate__(self) -> dict:
        return {"indexes": self.indexes, "columns": self.columns}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["indexes"], state["columns"])

    def arrays(self) -> dict[str, np.ndarray]:
        """Every index as plain arrays named ``keys-<table>-<part>`` (`KeyIndex.arrays`),
        what a checkpoint stores beside the state: a copy taken after the state's holds
        every key the state's rows hold, and the keys given rows since hold only 0s there."""
        with self._lock:
            return {
                f"{KEYS_PREFIX}{table}-{part}": array
                for table, index in self.indexes.items()
                for part, array in index.arrays().items()
            }

    def rows(self, events: pa.Table) -> pa.Table:
        """``events`` (one chunk, in ``ts`` order) with every key column turned into the
        rows of its keys (`KeyIndex.rows`): int64, null where the key is null, -1 where it
        is malformed."""
        by_table: dict[str, list[str]] = {}
        for column, table in self.columns.items():
            by_table.setdefault(table, []).append(column)
        with self._lock:
            for table, names in by_table.items():
                rows = self.indexes[table].rows([events.column(name) for name in names])
                for name, column in zip(names, rows, strict=True):
                    events = events.set_column(
                        events.schema.get_field_index(name), pa.field(name, pa.int64()), column
                    )
        return events

    def query(
        self,
        table: str,
        keys: list | None,
        read: Callable[[np.ndarray], tuple[int, pa.Table]],
    ) -> tuple[int, pa.Table]:
        """``(w, rows)`` of a table of natural keys: ``read(rows)`` gives the state's rows
        (``key`` = the row, the value columns and `LIVE`) as of ``w``; of these, the keys
        that exist, with their natural key: the given ``keys`` in that order (a missing
        one left out), or every key sorted."""
        index = self.indexes[table]
        with self._lock:
            if keys is None:
                rows = np.arange(len(index), dtype=np.int64)
            else:
                if index.key_type == STRING:  # a command line's ids may look like integers
                    keys = [str(k) for k in keys]
                try:
                    rows = index.find(pa.array(keys))
                except (SchemaError, pa.ArrowException) as exc:
                    raise UsageError(
                        f"query: keys of {table!r} are {index.key_type}: {exc}"
                    ) from exc
                rows = rows[rows >= 0]
            natural = index.keys(rows)
        if keys is None:
            order = np.asarray(pc.array_sort_indices(natural))
            rows, natural = rows[order], natural.take(pa.array(order))
        ts, got = read(rows)
        live = np.asarray(got.column(LIVE)) == 1
        got = got.drop_columns([LIVE]).set_column(0, "key", natural)
        return ts, got.filter(pa.array(live))


def restored_indexes(
    indexes: dict[str, KeyIndex], load: Callable[[str], np.ndarray]
) -> dict[str, KeyIndex]:
    """Empty copies of ``indexes`` holding the keys a checkpoint stored (`StreamKeys.arrays`;
    ``load(name)`` reads one of its arrays)."""
    restored = {}
    for table, index in indexes.items():
        fresh = KeyIndex(table, index.key_type, index.limit)
        parts = ("keys",) if index.key_type == INT64 else ("offsets", "bytes")
        fresh.restore({part: load(f"{KEYS_PREFIX}{table}-{part}") for part in parts})
        restored[table] = fresh
    return restored


def dense_keys(table: str, keys: list | None) -> list | None:
    """The keys of a query of a table of dense keys: UsageError unless integers."""
    if keys is not None and not all(isinstance(k, int | np.integer) for k in keys):
        raise UsageError(f"query: the keys of {table!r} are integers 0..K-1")
    return keys
