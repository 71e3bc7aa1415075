"""Natural keys: each table's index from a key (sparse int64 or UTF-8 string) to its row,
and the stable hash that places a key on a node (contract §2).

Schedulers and kernels work on dense rows only; a chunk's key columns are turned into rows
before it is handed to the team, in ``ts`` order, so a new key gets the next free row in
the order the stream first names it, whatever runs the chunk. An index is an open-addressing
hash table of ``row + 1`` (0: free slot) over the keys held in row order: for int64 keys
the values, for strings their bytes and offsets, so it costs the key bytes plus 8 bytes and
its slots (11 to 23 bytes; more in a small table, `SMALL`) a key. Its slots double a step at
a time (`KeyIndex._translate`), so that no chunk boundary pays for a whole doubling; its
arrays grow where they lie, never copied (`_grown`), and their fresh pages are faulted in
by a thread of its own (`_fault_in_later`).
"""

from __future__ import annotations

import ctypes
import mmap
import queue
import threading
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from txstream.config import KEY_TYPES
from txstream.errors import RuntimeFailure, SchemaError, UsageError
from txstream.state._numba import (
    inline,
    jit,
    load_byte,
    load_int64,
    load_word,
    prefetch,
    store_word,
)

DENSE, INT64, STRING = KEY_TYPES
"""Key types of a table: dense rows ``0..K-1`` (the key is the row), any int64, UTF-8."""
NATURAL = (INT64, STRING)
STRINGS = (pa.string(), pa.large_string())
"""The Arrow types of string keys the kernels read as they are (`_string_buffers`)."""
LIVE = "_live"
"""The column of a table of natural keys that is 1 where a key exists (contract §2)."""
KEYS_PREFIX = "keys-"
"""Names of the arrays of key indexes in a checkpoint (`StreamKeys.arrays`)."""
MISSING, FULL, UNKNOWN, NULL, NAMED = -1, -2, -3, -4, -16
"""Rows the kernels give a key that is not in the index (or malformed), one that did not
fit (`--max-keys`), a dictionary entry not looked up yet, a null key; and below NAMED,
the entries a chunk names while it is turned into rows (`_named_entries`)."""
DICTIONARIES = 8
"""String dictionaries whose rows an index keeps (a source's, used again by later chunks)."""


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
# The slots are an open-addressing table with linear probing and no wrap-around: a key's
# home is the top bits of its hash, and `PAD` slots past the last home catch the probes
# that run on. A slot holds ``tag | (row + 1)``, the tag being the hash's high 32 bits, so a
# probe past other keys rarely reads them (a cache miss each) and a doubling finds a key's
# new home in its slot alone; 0 is a free slot.
#
# A doubling takes the old slots over in slot order, a step each call (`KeyIndex._move`):
# a step reads them in order and writes the new slots nearly in order, so no chunk pays for
# all of it nor touches all the new memory at once. A step ends just past a free slot, so a
# run of keys is either moved whole or not at all: a key whose old home lies before the end
# of the steps (``done``) is in the new slots, any other in the old ones, which take the
# keys added there meanwhile: every key is looked for in one place, and the pages of the new
# slots are first touched in order, a step at a time. The old slots not taken over yet take
# a share of the new keys as large as theirs, while the steps take a share `MOVE_PER_KEY`
# times larger: their load rises by at most 1 / `MOVE_PER_KEY` before the last step.
LOW = (1 << 32) - 1
"""The bits of a slot that hold ``row + 1``."""
LOAD = 0.7
"""Largest share of used slots before the slots double."""
SMALL = 1 << 16
"""Homes up to which the slots double at half `LOAD`: so few stay in the caches at any
load, and a lookup there costs its probe's branches, fewer the more keys lie at home."""
PAD = 1 << 12
"""Slots past the last home, at most: a probe running past them doubles the slots."""
MAX_BITS = 32
"""Homes of at most 32 bits: a slot's tag then holds its home in slots of any size."""
MOVE_PER_KEY = 6
"""Old slots a call takes over per key it added (at least `MOVE_STEP`): the old slots'
last steps wait at a load of at most `LOAD` + 1/6, where probes still end soon, and a
doubling's steps spread over more chunks."""
MOVE_STEP = 1 << 16
NOT_MOVING = 1 << 62
"""``done`` when no slots are being taken over: every home lies before it."""
NO_SLOTS = np.zeros(1, np.int64)
NONE_NULL = np.ones(0, bool)
"""The validity a kernel is given for keys of which none is null."""
AHEAD = 64
"""Keys whose slots a kernel reads ahead before it probes them: misses that overlap."""
FETCH_AHEAD = 16
"""Keys before its probe that a string kernel asks for a key's home slot (`_fetch`)."""
AHEAD_FROM = 1 << 18
"""Slots past which they are read ahead (fewer stay cached, and reading ahead costs more
than it saves)."""
PIECE_ROW, PIECE_FIRST, PIECE_LENGTH, PIECE_KEYS, PIECE_BITS, PIECE_BIT = range(6)
"""Columns of a row of `_piece_table`."""
PREFETCH = 16
"""Keys ahead of a lookup whose home slots it asks the caches for: a chunk's own columns
pass through the caches between chunks, and take the slots out of them."""
RESERVED = 1 << 36
"""Bytes of address space an array of keys is given when it first grows (`_grown`): no
memory until written, and beyond what a process holds, so that the array never moves."""
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
"""Linux's flag for a mapping that reserves no swap (Python's mmap names it from 3.12)."""
FAULT_FROM = 1 << 20
"""Bytes of fresh room from which a thread of its own faults its pages in (`_fault_in_later`)."""
FAULT_PIECE = 1 << 20
"""Bytes it faults in a call: the process's mappings are locked for no longer than that."""
MADV_POPULATE_WRITE = 23
"""Linux's advice (5.14 on) that faults a range's pages in as a write would, keeping what
they hold."""
MOVE_EVERY = 1 << 12
"""Keys a kernel adds while slots are taken over before it stops for a step (`_move`)."""
DONE, LOADED, STEP, ROWS_FULL, BYTES_FULL = range(5)
"""Why a kernel stopped: every key translated, or the room it lacks (`KeyIndex._translate`)."""


@inline
def _tag(hashed):
    return np.int64(hashed >> np.uint64(32)) << 32


@inline
def _row(slot):
    return (slot & LOW) - 1


@inline
def _home(hashed, shift):
    return np.int64(hashed >> np.uint64(shift))


@inline
def _probe_int(slots, shift, keys_by_row, key, hashed):
    """The slot of ``key`` (of hash ``hashed``), or the free slot where it would go; -1 if
    the probe runs past the last slot. Most keys lie at their home or the slot after it:
    the two are read and one chosen without a branch, since a branch on where a key lies
    is mispredicted often and costs more than the probe (a home is followed by a slot)."""
    tag = _tag(hashed)
    h = _home(hashed, shift)
    first, second = slots[h], slots[h + 1]
    at_home = np.int64(first - (first & LOW) == tag)
    slot = first * at_home + second * (1 - at_home) * np.int64(second - (second & LOW) == tag)
    if slot != 0 and keys_by_row[_row(slot)] == key:
        return h + 1 - at_home
    while h < len(slots):
        slot = slots[h]
        if slot == 0 or (slot - (slot & LOW) == tag and keys_by_row[_row(slot)] == key):
            return h
        h += 1
    return -1


@inline
def _place_int(slots, shift, old, old_shift, done, keys_by_row, key, hashed):
    """The slots that hold ``key`` or would (the old ones while its old home is not taken
    over), and its slot there or the free one where it would go (`_probe_int`)."""
    if _home(hashed, old_shift) >= done:
        return old, _probe_int(old, old_shift, keys_by_row, key, hashed)
    return slots, _probe_int(slots, shift, keys_by_row, key, hashed)


@inline
def _same(data, start, end, key_offsets, key_bytes, row):
    """Whether row ``row`` holds the string ``data[start:end]``: eight bytes at a time."""
    a, b = key_offsets[row], key_offsets[row + 1]
    n = end - start
    if b - a != n:
        return False
    i = 0
    while i + 8 <= n:
        if load_word(key_bytes, a + i) != load_word(data, start + i):
            return False
        i += 8
    while i < n:
        if key_bytes[a + i] != data[start + i]:
            return False
        i += 1
    return True


@inline
def _copy(data, start, end, key_bytes, at):
    """``key_bytes[at:]`` = ``data[start:end]``, eight bytes at a time."""
    n = end - start
    i = 0
    while i + 8 <= n:
        store_word(key_bytes, at + i, load_word(data, start + i))
        i += 8
    while i < n:
        key_bytes[at + i] = data[start + i]
        i += 1


@inline
def _probe_bytes(slots, shift, key_offsets, key_bytes, data, start, end, hashed):
    tag = _tag(hashed)
    h = _home(hashed, shift)
    while h < len(slots):
        slot = slots[h]
        if slot == 0 or (
            slot - (slot & LOW) == tag
            and _same(data, start, end, key_offsets, key_bytes, _row(slot))
        ):
            return h
        h += 1
    return -1


@inline
def _place_bytes(slots, shift, old, old_shift, done, key_offsets, key_bytes, data, a, b, hashed):
    """As `_place_int`, for the string ``data[a:b]``."""
    if _home(hashed, old_shift) >= done:
        return old, _probe_bytes(old, old_shift, key_offsets, key_bytes, data, a, b, hashed)
    return slots, _probe_bytes(slots, shift, key_offsets, key_bytes, data, a, b, hashed)


@inline
def _touch(slots, shift, old, old_shift, done, keys_by_row, hashed, depth):
    """What a probe of an int key reads first, ``depth`` loads deep: its home slot (0); if
    its tag is the key's, the key its row holds (1)."""
    if _home(hashed, old_shift) >= done:
        slot = old[_home(hashed, old_shift)]
    else:
        slot = slots[_home(hashed, shift)]
    if depth == 0 or slot == 0 or slot - (slot & LOW) != _tag(hashed):
        return slot
    return keys_by_row[_row(slot)]


@inline
def _fetch(slots, shift, old, old_shift, done, key_offsets, key_bytes, hashed, depth):
    """Ask for what a probe of a string key reads first, ``depth`` loads deep, without
    waiting for it (`prefetch`): its home slot (0); if its tag is the key's, where the key
    its row holds starts (1) and that key's bytes (2), the slot (and offsets) asked for
    keys earlier."""
    if _home(hashed, old_shift) >= done:
        table, h = old, _home(hashed, old_shift)
    else:
        table, h = slots, _home(hashed, shift)
    if depth == 0:
        prefetch(table, h)
        return
    slot = table[h]
    if slot - (slot & LOW) != _tag(hashed):  # a free slot too, unless the tag is 0: harmless
        return
    if depth == 1:
        prefetch(key_offsets, _row(slot))
    else:
        prefetch(key_bytes, key_offsets[_row(slot)])


@jit
def _rows_ints(index, keys_by_row, keys, valid, start, out):
    """The rows of ``keys`` (event by event, each event's key columns in order, its key
    ``valid`` or not: no mask, none is null) from position ``start``, each missing key
    added at the next row (FULL past the limit).
    ``index``: [slots, shift, old slots, old shift, done, count, limit, room, the count
    at which to stop for a step].
    Returns (count, the position reached, why it stopped, a sum of what `_touch` read)."""
    slots, shift, old, old_shift, done, count, limit, room, step = index
    touched = 0
    ahead = len(slots) + len(old) > AHEAD_FROM
    for p in range(start, len(keys)):
        if ahead and (p - start) % AHEAD == 0:  # each load of a block's keys, then the next
            for depth in range(2):
                for q in range(p, min(p + AHEAD, len(keys))):
                    hashed = _hash_int(keys[q])
                    touched += _touch(
                        slots, shift, old, old_shift, done, keys_by_row, hashed, depth
                    )
        if len(valid) and not valid[p]:
            out[p] = NULL
            continue
        key = keys[p]
        hashed = _hash_int(key)
        table, h = _place_int(slots, shift, old, old_shift, done, keys_by_row, key, hashed)
        if h < 0:
            return count, p, LOADED, touched
        slot = table[h]
        if slot == 0:
            if count == limit:
                out[p] = FULL
                continue
            if count == len(keys_by_row):
                return count, p, ROWS_FULL, touched
            if count >= room:
                return count, p, LOADED, touched
            if count == step:
                return count, p, STEP, touched
            keys_by_row[count] = key
            count += 1
            slot = table[h] = _tag(hashed) | count
        out[p] = _row(slot)
    return count, len(keys), DONE, touched


@jit
def _rows_strings(index, key_offsets, key_bytes, offsets, data, hashes, entry, cached, start, out):
    """As `_rows_ints` for strings, given as the ``entry`` of every key (-1: null) among
    distinct strings (``offsets``, ``data``, their ``hashes``) whose rows are ``cached``
    (UNKNOWN: not looked up yet). An empty string is malformed (MISSING). The loads of a
    key's probe are asked for (`_fetch`) `FETCH_AHEAD` keys before it, one load deeper
    every time the distance halves. Returns (count, the position reached, why it stopped)."""
    slots, shift, old, old_shift, done, count, limit, room, step = index
    ahead = len(slots) + len(old) > AHEAD_FROM
    n = len(entry)
    for p in range(start, n):
        if ahead:
            for depth in range(3):
                q = p + (FETCH_AHEAD >> depth)
                if q < n and entry[q] >= 0 and cached[entry[q]] == UNKNOWN:
                    e = entry[q]
                    _fetch(
                        slots, shift, old, old_shift, done, key_offsets, key_bytes, hashes[e], depth
                    )
        e = entry[p]
        if e < 0:
            out[p] = NULL
            continue
        if cached[e] != UNKNOWN:
            out[p] = cached[e]
            continue
        a, b = offsets[e], offsets[e + 1]
        if a == b:
            out[p] = cached[e] = MISSING
            continue
        hashed = hashes[e]
        table, h = _place_bytes(
            slots, shift, old, old_shift, done, key_offsets, key_bytes, data, a, b, hashed
        )
        if h < 0:
            return count, p, LOADED
        slot = table[h]
        if slot == 0:
            if count == limit:
                out[p] = FULL
                continue
            if count + 1 == len(key_offsets):
                return count, p, ROWS_FULL
            used = key_offsets[count]
            if used + b - a > len(key_bytes):
                return count, p, BYTES_FULL
            if count >= room:
                return count, p, LOADED
            if count == step:
                return count, p, STEP
            _copy(data, a, b, key_bytes, used)
            key_offsets[count + 1] = used + b - a
            count += 1
            slot = table[h] = _tag(hashed) | count
        out[p] = cached[e] = _row(slot)
    return count, n, DONE


@inline
def _slot_int(slots, shift, old, old_shift, done, keys_by_row, key, hashed):
    """The slot holding ``key``; 0 if none does."""
    table, h = _place_int(slots, shift, old, old_shift, done, keys_by_row, key, hashed)
    return table[h] if h >= 0 else 0


@inline
def _prefetch_home(slots, shift, old, old_shift, done, hashed):
    """Ask the caches for the home slot of a key of hash ``hashed`` (`_place_int`)."""
    if _home(hashed, old_shift) >= done:
        prefetch(old, _home(hashed, old_shift))
    else:
        prefetch(slots, _home(hashed, shift))


@jit
def _found_ints(slots, shift, old, old_shift, done, keys_by_row, pieces, at, hashes, out):
    """The rows of the int64 keys of ``pieces`` (`_piece_table`), NULL where not valid;
    False at the first key missing. One call for a chunk's columns of a table, however many
    pieces they come in: no lock taken, released or waited for between pieces."""
    where = (slots, shift, old, old_shift, done)
    for p in range(len(pieces)):
        rows = out[pieces[p, PIECE_ROW], pieces[p, PIECE_FIRST] :][: pieces[p, PIECE_LENGTH]]
        keys, bits, bit = pieces[p, PIECE_KEYS], pieces[p, PIECE_BITS], pieces[p, PIECE_BIT]
        n = _listed(keys, bits, bit, len(rows), at, hashes, rows)
        if done == NOT_MOVING:  # a constant: no key's probe then tests which slots hold it
            found = _found(where, False, keys_by_row, keys, bits, at, hashes, n, rows)
        else:
            found = _found(where, True, keys_by_row, keys, bits, at, hashes, n, rows)
        if not found:
            return False
    return True


@inline
def _listed(keys, bits, bit, length, at, hashes, out):
    """The positions of a piece's keys that are not null (into ``at``; ``out`` NULL there)
    and their hashes (into ``hashes``); how many. They are listed and hashed before any is
    probed: no probe waits for a multiply or a branch on a null, mispredicted as often as
    nulls are mixed in, and the loads of several probes overlap."""
    if bits == 0:
        for i in range(length):
            hashes[i] = _hash_int(load_int64(keys, i))
        return length
    n = 0
    for i in range(length):
        out[i] = NULL
        at[n] = i
        n += (load_byte(bits, (bit + i) >> 3) >> ((bit + i) & 7)) & 1
    for j in range(n):
        hashes[j] = _hash_int(load_int64(keys, at[j]))
    return n


@inline
def _found(where, moving, keys_by_row, keys, bits, at, hashes, n, out):
    """The rows of a piece's ``n`` keys `_listed`, in the slots ``where`` (old slots being
    taken over or not: ``moving``)."""
    slots, shift, old, old_shift, done = where
    for j in range(n):
        if j + PREFETCH < n:
            if moving:
                _prefetch_home(slots, shift, old, old_shift, done, hashes[j + PREFETCH])
            else:
                prefetch(slots, _home(hashes[j + PREFETCH], shift))
        i = at[j] if bits else j
        key = load_int64(keys, i)
        if moving:
            slot = _slot_int(slots, shift, old, old_shift, done, keys_by_row, key, hashes[j])
        else:
            h = _probe_int(slots, shift, keys_by_row, key, hashes[j])
            slot = slots[h] if h >= 0 else 0
        if slot == 0:
            return False
        out[i] = _row(slot)
    return True


@jit
def _find_ints(slots, shift, old, old_shift, done, keys_by_row, keys, out):
    for i in range(len(keys)):
        hashed = _hash_int(keys[i])
        slot = _slot_int(slots, shift, old, old_shift, done, keys_by_row, keys[i], hashed)
        out[i] = _row(slot) if slot != 0 else MISSING


@jit
def _find_strings(slots, shift, old, old_shift, done, key_offsets, key_bytes, offsets, data, out):
    for i in range(len(out)):
        a, b = offsets[i], offsets[i + 1]
        hashed = _hash_bytes(data, a, b)
        table, h = _place_bytes(
            slots, shift, old, old_shift, done, key_offsets, key_bytes, data, a, b, hashed
        )
        slot = table[h] if h >= 0 else 0
        out[i] = _row(slot) if slot != 0 and a != b else MISSING


@jit
def _take_over(old, done, end, slots, shift):
    """Put the keys of the old slots from ``done`` on into ``slots``, up to ``end`` and on
    to just past a free slot; returns where it stopped (-1: a probe ran past the last
    slot). A key's new home is the top bits of its tag."""
    bits = 64 - shift
    p = done
    while p < len(old):
        slot = old[p]
        p += 1
        if slot != 0:
            h = ((slot >> 32) & LOW) >> (MAX_BITS - bits)
            while h < len(slots) and slots[h] != 0:
                h += 1
            if h == len(slots):
                return -1
            slots[h] = slot
        elif p >= end:
            break
    return p


# ---------------------------------------------------------------- the index
class KeyIndex:
    """The rows of one table's natural keys (module docstring); at most ``limit`` keys."""

    def __init__(self, table: str, key_type: str, limit: int):
        if key_type not in NATURAL:
            raise ValueError(f"a key index holds int64 or string keys, not {key_type!r}")
        if limit >= LOAD * (1 << MAX_BITS):
            raise UsageError(f"--max-keys must be below {int(LOAD * (1 << MAX_BITS))}")
        self.table, self.key_type, self.limit = table, key_type, limit
        self.count = 0
        self._slots, self._shift = _slots(4)
        self._old, self._old_shift = NO_SLOTS, 63
        """The slots `_slots` are taking over (`_move`), and the shift of their homes."""
        self._done = NOT_MOVING
        """The old slots taken over so far: those before this."""
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
        columns with the same nulls; a missing key is given the next row in the order of
        first appearance, event by event and, within an event, column by column.
        A malformed key (an empty string) gets -1. RuntimeFailure past `limit` keys.
        Strings are looked up once per distinct string (per dictionary entry)."""
        pieces = [_pieces(column, self.key_type) for column in columns]
        n = sum(len(piece) for piece in pieces[0]) if pieces else 0
        out = _pooled((len(columns), n))
        if not self._known(pieces, out):
            if self.key_type == INT64:
                keys = [np.concatenate([_ints(p) for p in column] or [[]]) for column in pieces]
                valid = [_valid_or_none(column) for column in pieces]
                added = self._translate(_interleaved(keys), _masks(valid))
            else:
                added = self._rows_of_entries(pieces)
            if (added == FULL).any():
                raise RuntimeFailure(
                    f"table {self.table!r}: more than {self.limit} keys (--max-keys {self.limit})"
                )
            out[:] = added.reshape(n, len(columns)).T
        return [pa.chunked_array([_with_nulls(out[i], column)]) for i, column in enumerate(pieces)]

    def _known(self, pieces: list[list[pa.Array]], out: np.ndarray) -> bool:
        """Fill ``out`` (a row of it per column) with the rows of the keys if the index
        holds every one: a lookup alone, piece by piece, that stops at the first missing key
        (for strings, a gather from the rows of their dictionary's entries)."""
        if self.key_type == INT64:
            table = _piece_table(pieces)
            longest = int(table[:, PIECE_LENGTH].max()) if len(table) else 0
            at, hashes = np.empty(longest, np.int64), np.empty(longest, np.uint64)
            where = (self._slots, self._shift, self._old, self._old_shift, self._done)
            return _found_ints(*where, self._keys, table, at, hashes, out)
        for column, rows in zip(pieces, out, strict=True):
            at = 0
            for piece in column:
                got, at = rows[at : at + len(piece)], at + len(piece)
                valid = _valid(piece) if piece.null_count else NONE_NULL
                known = self._entry_rows(piece.dictionary)
                if _gather(_indices(piece), valid, known, got):
                    return False
        return True

    def _rows_of_entries(self, pieces: list[list[pa.DictionaryArray]]) -> np.ndarray:
        """The rows of dictionary-encoded string columns (`_interleaved`), their
        dictionaries' entries looked up once (and kept for later chunks, `_entry_rows`).
        Of a dictionary (a source's may serve many chunks) only the entries the chunk names
        are taken."""
        entry, named, taken, rows_found, first = [], [], [], [], 0
        for column in pieces:
            local = []
            for piece in column:
                rows = self._entry_rows(piece.dictionary)
                numbers = np.empty(len(piece), np.int32)
                used = np.empty(len(piece), np.int64)
                found = np.empty(len(piece), np.int64)
                valid = _valid(piece) if piece.null_count else NONE_NULL
                n = _named_entries(_indices(piece), valid, rows, first, numbers, used, found)
                local.append(numbers)
                named.append(_conformed(piece.dictionary.take(used[:n]), STRING, "events"))
                taken.append((rows, used[:n]))
                rows_found.append(found[:n])
                first += n
            entry.append(np.concatenate(local or [np.zeros(0, np.int32)]))
        every = np.concatenate(rows_found or [[]]).astype(np.int64)
        entries = _joined(named) if named else pa.array([], pa.large_string())
        try:
            return self._translate(_interleaved(entry), entries=entries, cached=every)
        finally:  # the rows found replace the marks `_named_entries` left
            at = 0
            for rows, used in taken:
                rows[used] = every[at : at + len(used)]
                at += len(used)

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
        where = (self._slots, self._shift, self._old, self._old_shift, self._done)
        if self.key_type == INT64:
            _find_ints(*where, self._keys, _ints(keys), out)
        else:
            _find_strings(*where, self._keys, self._bytes, *_string_buffers(keys), out)
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
        """Rows of ``keys`` (one column, without nulls), adding the missing ones in order."""
        keys = _conformed(keys, self.key_type, "keys")
        if self.key_type == INT64:
            return self._translate(_ints(keys), _masks([None]))
        entry = np.arange(len(keys), dtype=np.int32)
        return self._translate(entry, entries=keys, cached=np.full(len(keys), UNKNOWN))

    def _translate(
        self,
        keys: np.ndarray,
        valid: np.ndarray | None = None,
        entries: pa.Array | None = None,
        cached: np.ndarray | None = None,
    ) -> np.ndarray:
        """Rows of int64 ``keys`` (with their ``valid`` mask), or of the string ``entries``
        that ``keys`` point to (-1: null), each event's keys one after the other, adding
        the missing ones in order: a kernel runs until done or out of room, which is made
        before it goes on, and while slots are taken over it stops for a step every
        `MOVE_EVERY` keys it adds, so that the old slots never take many keys between steps.
        Then the old slots are taken over a step further."""
        out = np.empty(keys.shape, np.int64)
        if entries is not None:
            offsets, data = _string_buffers(entries)
            room_bytes = int(offsets[-1] - offsets[0]) if len(entries) else 0
            hashes = np.empty(len(entries), np.uint64)
            _hash_strings(offsets, data, hashes)
        moved, start, stopped = self.count, 0, LOADED
        while stopped != DONE:
            index = (
                self._slots,
                self._shift,
                self._old,
                self._old_shift,
                self._done,
                self.count,
                self.limit,
                _room(self._shift),
                self.count + MOVE_EVERY if self._done < len(self._old) else -1,
            )
            if entries is None:
                got = _rows_ints(index, self._keys, keys, valid, start, out)
            else:
                got = _rows_strings(
                    index, self._keys, self._bytes, offsets, data, hashes, keys, cached, start, out
                )
            self.count, start, stopped = got[:3]
            if stopped == LOADED:  # the last doubling's steps all taken
                self._double()
                moved = self.count
            elif stopped == STEP:
                self._move(MOVE_PER_KEY * (self.count - moved))
                moved = self.count
            elif stopped == ROWS_FULL:  # room for every key of the call
                self._keys = _grown(self._keys, self.count + 2 + keys.size - start)
            elif stopped == BYTES_FULL:
                self._bytes = _grown(self._bytes, int(self._keys[self.count]) + room_bytes)
        self._move(max(MOVE_STEP, MOVE_PER_KEY * (self.count - moved)))
        return out

    def _double(self) -> None:
        """Slots twice as many, taking the present ones over in steps (`_move`), the
        last doubling's first."""
        self._move(len(self._old))
        self._old, self._old_shift = self._slots, self._shift
        self._slots, self._shift = _slots(65 - self._shift)
        self._done = 0

    def _move(self, step: int) -> None:
        """Take the old slots over ``step`` slots further (on to a free one)."""
        if self._done >= len(self._old):
            return
        done = _take_over(self._old, self._done, self._done + step, self._slots, self._shift)
        if done < 0:
            raise RuntimeFailure(f"table {self.table!r}: the key index overflowed its slots")
        self._done = done
        if done == len(self._old):
            self._old, self._old_shift, self._done = NO_SLOTS, 63, NOT_MOVING


def _slots(bits: int) -> tuple[np.ndarray, int]:
    """Free slots for homes of ``bits`` bits, and the shift that gives a hash's home."""
    if bits > MAX_BITS:
        raise RuntimeFailure(f"a key index of more than 2^{MAX_BITS} slots")
    shift = 64 - bits
    slots = _zeros((1 << bits) + _pad(shift), np.int64)
    _fault_in_later(slots, 0)
    return slots, shift


def _room(shift: int) -> int:
    """Keys the slots of homes past ``shift`` hold before they double."""
    homes = 1 << (64 - shift)
    return int((LOAD if homes > SMALL else LOAD / 2) * homes)


def _pad(shift: int) -> int:
    return min(PAD, 1 << (64 - shift))


_LIBC = ctypes.CDLL(None, use_errno=True)
_FAULTS: queue.SimpleQueue = queue.SimpleQueue()
"""Arrays, and where their fresh room starts, whose pages `_fault_in` is to fault in."""
_FAULTER_LOCK = threading.Lock()
_faulter: list[threading.Thread] = []
"""The thread that runs `_fault_in`, started once a process needs it."""


def _fault_in_later(array: np.ndarray, start: int) -> None:
    """Have a thread of its own fault in the pages of ``array[start:]``, fresh memory the
    kernels are about to fill, while they go on: a first write to a page costs microseconds
    on a virtual machine, more than what the kernels write there, and a doubling's slots
    take thousands of pages at once. A page written first by a kernel costs the thread only
    a look."""
    if (len(array) - start) * array.itemsize < FAULT_FROM:
        return
    _FAULTS.put((array, start))
    with _FAULTER_LOCK:
        if not (_faulter and _faulter[0].is_alive()):  # none yet, or a forked process's
            _faulter[:] = [threading.Thread(target=_fault_in, name="key-pages", daemon=True)]
            _faulter[0].start()


def _fault_in() -> None:
    """Fault in the pages `_fault_in_later` is given, for good: a piece of each array in
    turn, the order the kernels fill them in when tables grow together (ctypes lets go of
    the GIL in the call). An older kernel refuses the advice: the writes fault them in."""
    pending: list[list] = []
    while True:
        if not pending:
            pending.append(_faults_of(*_FAULTS.get()))
        while not _FAULTS.empty():
            pending.append(_faults_of(*_FAULTS.get()))
        for job in pending:
            _, at, end = job
            size = ctypes.c_size_t(min(FAULT_PIECE, end - at))
            failed = _LIBC.madvise(ctypes.c_void_p(at), size, MADV_POPULATE_WRITE) != 0
            job[1] = end if failed else at + FAULT_PIECE
        pending = [job for job in pending if job[1] < job[2]]


def _faults_of(array: np.ndarray, start: int) -> list:
    """[the array, the page ``array[start]`` lies in, the end of the array] (addresses)."""
    at = (array.ctypes.data + start * array.itemsize) & -mmap.PAGESIZE
    return [array, at, array.ctypes.data + array.nbytes]


def _grown(array: np.ndarray, wanted: int) -> np.ndarray:
    """``array`` with room for ``wanted`` items and a 64th more: a longer view of the memory
    it lies in, `RESERVED` when it first grows, so that growing never copies it (an array
    resized in place is copied whenever the allocator cannot extend it where it lies) and
    costs only the pages the new room takes once written."""
    n = max(wanted + wanted // 64, 16)
    base = array.base
    if isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap):
        if n * array.itemsize <= base.nbytes:
            grown = np.frombuffer(base, array.dtype, n)
            _fault_in_later(grown, len(array))
            return grown
    grown = _zeros(n, array.dtype, max(RESERVED, 2 * n * array.itemsize))
    grown[: len(array)] = array
    _fault_in_later(grown, len(array))
    return grown


def _zeros(n: int, dtype: type | np.dtype, reserved: int = 0) -> np.ndarray:
    """``n`` zeros in memory of their own (``reserved`` bytes of address space, at least
    theirs), mapped without huge pages: a page costs only once written, a write to a fresh
    page zeroes 4 KiB rather than 2 MiB, and no huge page is split when the slots of a
    doubling are taken over or the array grows."""
    nbytes = max(n * np.dtype(dtype).itemsize, reserved, 1)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (MAP_NORESERVE if reserved else 0)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype, n)


@jit
def _gather(indices, valid, entry_rows, out):
    """``out[i]``: the row of dictionary entry ``indices[i]`` (NULL where not ``valid``;
    empty: none is null); how many entries were not looked up yet (UNKNOWN). A null reads
    entry 0 and is then masked: no branch on a null, mispredicted as often as nulls are
    mixed in (and a null's index may point anywhere)."""
    unknown = 0
    if len(valid) == 0:
        for i in range(len(out)):
            out[i] = entry_rows[indices[i]]
            unknown += out[i] == UNKNOWN
        return unknown
    if len(entry_rows) == 0:
        out[:] = NULL
        return 0
    for i in range(len(out)):
        v = np.int64(valid[i])
        row = entry_rows[indices[i] * v]
        out[i] = NULL + (row - NULL) * v
        unknown += np.int64(row == UNKNOWN) * v
    return unknown


@jit
def _named_entries(indices, valid, entry_rows, first, local, used, found):
    """The entries of a dictionary that a column names, each once, numbered from
    ``first`` in order of first use: ``local[i]``, the number of key ``i`` (-1: null);
    ``used``, the entries; ``found``, their rows known so far. An entry numbered is marked
    in ``entry_rows`` by its number (`NAMED` - number, to be replaced by its row), so that
    the columns sharing a dictionary share its numbers (``valid`` empty: no key is null).
    Returns how many are new."""
    n = 0
    for i in range(len(indices)):
        if len(valid) and not valid[i]:
            local[i] = -1
            continue
        e = indices[i]
        if entry_rows[e] <= NAMED:
            local[i] = NAMED - entry_rows[e]
            continue
        used[n], found[n] = e, entry_rows[e]
        local[i] = first + n
        entry_rows[e] = NAMED - local[i]
        n += 1
    return n


def _indices(column: pa.DictionaryArray) -> np.ndarray:
    """The int32 indices of a dictionary array (`_dictionary_encoded`), without copying."""
    indices = np.frombuffer(column.indices.buffers()[1], np.int32)
    return indices[column.offset : column.offset + len(column)]


def _pooled(shape: tuple[int, int]) -> np.ndarray:
    """An empty int64 array in Arrow's memory pool: a chunk's rows are freed there when the
    team is done with them and the next chunk's take their pages again, where new pages
    from the system would each cost a fault."""
    return np.frombuffer(pa.allocate_buffer(8 * shape[0] * shape[1]), np.int64).reshape(shape)


def _with_nulls(rows: np.ndarray, pieces: list[pa.Array]) -> pa.Array:
    """``rows`` (C-contiguous, not copied) as an int64 array with the nulls of the key
    column ``pieces``."""
    bits = None
    if any(piece.null_count for piece in pieces):  # the pieces' bitmaps, joined by Arrow
        bits = pa.concat_arrays([piece.is_valid() for piece in pieces]).buffers()[1]
    return pa.Array.from_buffers(pa.int64(), len(rows), [bits, pa.py_buffer(rows)])


def _interleaved(columns: list[np.ndarray]) -> np.ndarray:
    """Columns of one chunk as one array, event by event: the order new keys get rows."""
    return np.stack(columns, axis=1).ravel() if columns else np.zeros(0, np.int64)


def _masks(valid: list[np.ndarray | None]) -> np.ndarray:
    """The validity of key columns, `_interleaved` (empty when none has nulls)."""
    if all(v is None for v in valid):
        return NONE_NULL
    n = len(next(v for v in valid if v is not None))
    return _interleaved([np.ones(n, bool) if v is None else v for v in valid])


# ---------------------------------------------------------------- Arrow columns
def _pieces(column: pa.ChunkedArray | pa.Array, key_type: str) -> list[pa.Array]:
    """A key column's chunks, each as int64 (`_conformed`) or as a dictionary array
    (`_dictionary_encoded`): the chunks of a source share its dictionaries, which are
    looked up once; merging them would hash every entry again."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if key_type == INT64:
        return [_conformed(chunk, INT64, "events") for chunk in chunks]
    return [_dictionary_encoded(chunk) for chunk in chunks]


def _dictionary_encoded(piece: pa.Array) -> pa.DictionaryArray:
    """A string key array as a dictionary array with int32 indices; SchemaError if it holds
    no strings."""
    value_type = piece.type.value_type if pa.types.is_dictionary(piece.type) else piece.type
    if pa.types.is_null(value_type):
        return pa.DictionaryArray.from_arrays(
            pa.nulls(len(piece), pa.int32()), pa.array([], pa.string())
        )
    if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)):
        raise SchemaError(f"events: key of type {value_type}, expected string")
    if not pa.types.is_dictionary(piece.type):
        piece = pc.dictionary_encode(piece)
    if piece.indices.type != pa.int32():
        piece = pa.DictionaryArray.from_arrays(piece.indices.cast(pa.int32()), piece.dictionary)
    return piece


def _conformed(keys: pa.Array | pa.ChunkedArray, key_type: str, label: str) -> pa.Array:
    """``keys`` (any array, chunked or dictionary-encoded) as one int64 array, or one
    string or large_string array (a lone one as it is: `_string_buffers` reads either
    without copying its bytes); SchemaError if they are of another kind."""
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
    if len(chunks) == 1 and chunks[0].type in ((pa.int64(),) if key_type == INT64 else STRINGS):
        return chunks[0]
    wanted = pa.int64() if key_type == INT64 else pa.large_string()
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
    """Where ``keys`` are not null, from the validity bitmap."""
    if keys.null_count == 0:
        return np.ones(len(keys), bool)
    if pa.types.is_null(keys.type):
        return np.zeros(len(keys), bool)
    bits = np.unpackbits(np.frombuffer(keys.buffers()[0], np.uint8), bitorder="little")
    return bits[keys.offset : keys.offset + len(keys)].view(bool)


def _piece_table(pieces: list[list[pa.Array]]) -> np.ndarray:
    """The pieces of int64 key columns as `_found_ints` reads them, a row each: the row of
    the output it fills, from which position, how many keys; the address of its keys, of
    its validity bitmap (0: none is null) and the bit of its first key. The caller keeps
    the pieces alive."""
    table = np.zeros((sum(len(column) for column in pieces), 6), np.int64)
    p = 0
    for row, column in enumerate(pieces):
        first = 0
        for piece in column:
            nulls, keys = piece.buffers()[:2]
            n, offset = len(piece), piece.offset
            table[p] = (row, first, n, keys.address + 8 * offset if n else 0, 0, offset)
            if piece.null_count:
                table[p, PIECE_BITS] = nulls.address
            first, p = first + n, p + 1
    return table


def _valid_or_none(pieces: list[pa.Array]) -> np.ndarray | None:
    """Where the key column ``pieces`` are not null; None when none is."""
    if not any(piece.null_count for piece in pieces):
        return None
    return np.concatenate([_valid(piece) for piece in pieces])


def _string_buffers(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Offsets (int64, one more than keys) and bytes of a string or large_string array."""
    buffers = keys.buffers()
    width = np.int64 if keys.type == pa.large_string() else np.int32
    offsets = np.frombuffer(buffers[1], width)[keys.offset : keys.offset + len(keys) + 1]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return np.ascontiguousarray(offsets, np.int64), data


def _joined(arrays: list[pa.Array]) -> pa.Array:
    """String arrays as one: in their own type if they share it and its offsets hold the
    bytes, else as large_string."""
    if len(arrays) == 1:
        return arrays[0]
    if len({a.type for a in arrays}) == 1:
        try:
            return pa.concat_arrays(arrays)
        except (pa.ArrowInvalid, pa.ArrowCapacityError):  # more bytes than 32-bit offsets reach
            pass
    return pa.concat_arrays([a.cast(pa.large_string()) for a in arrays])


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
