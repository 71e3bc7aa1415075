"""The topology API: tables, user functions, and vectorised operators.

A topology is three vectorised operators over a batch of events (Arrow columns):

* ``pre_process(events)`` validates and calls ``events.reject(mask, reason)``;
* ``state_access(events, txn)`` emits the batch's state transactions as columns of
  operations (READ, WRITE, READ_MODIFY, SET_ADD) through a :class:`Transactions`
  builder: one call emits one *statement* for every event selected by ``where``;
* ``post_process(events, outputs)`` turns the operations' results into output columns.

Statement order inside a transaction is the order of the builder calls (and, for a
list-valued key, list order). User functions (``fun``/``cond``) are numba-compiled
when the topology is built; the engine calls them from its kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from txstream.errors import SchemaError, TopologyError
from txstream.state._kernels import ARG, AT_LEAST_ARG, CALLED, VALUE, Udf, compile_for
from txstream.state._numba import USER_SIG, as_float_pointer, bits_as_float, float_as_bits
from txstream.state.keys import DENSE, KEY_TYPES, LIVE, NATURAL
from txstream.state.keys import STRING as STRING_KEY
from txstream.state.layout import Layout
from txstream.state.operations import COMMITTED, READ, READ_MODIFY, SET_ADD, WRITE
from txstream.state.values import (
    DECIMAL_OVERFLOW,
    INT64,
    ValueType,
    exact_decimals,
    float_bits,
    is_decimal_input,
    is_float_input,
    units,
    value_type,
)
from txstream.topologies._kernels import (
    CONSTANT,
    INT_COLUMN,
    LIST_COLUMN,
    committed_keys,
    reject_outside,
    reject_unset,
)

# Event column types a topology can declare (and decimals, `txstream.state.values`).
INT, STRING, INT_LIST, FLOAT = "int64", "string", "list<int64>", "float64"
DICTIONARY_STRING = pa.dictionary(pa.int32(), pa.string())
"""How the engine holds a STRING column (`Topology.event_schema`): dictionary-encoded, as
Parquet stores such columns, so that reading it copies no strings, a chunk's pieces
concatenate without copying them, and its kinds are matched once per distinct string."""
LIST_INT64 = pa.list_(pa.int64())
"""How the engine holds an INT_LIST column (`Topology.event_schema`)."""
INT64_MAX = int(np.iinfo(np.int64).max)
_EVERY = np.zeros(0, bool)
"""No ``where`` mask, for the validation kernels: every event."""
_NO_ROWS = np.zeros(0, np.int64)
"""No list offsets, for the validation kernels: a plain column."""
_EVERY.flags.writeable = _NO_ROWS.flags.writeable = False  # as the kernels take arrays


# ---------------------------------------------------------------- tables
@dataclass(frozen=True)
class Table:
    """A state table of value columns, whose keys are ``key``: dense rows
    ``0..K-1`` (K: the rows of its init state), or natural ``int64`` or ``string`` keys,
    which may be created, deleted and created again (contract §2).

    ``distinct=True`` makes every key hold a *set* of members; its single value column
    is the set's size (maintained by SET_ADD). ``size_of`` names a table whose K this
    one takes; such a table starts empty and reads no init file. ``init_min`` is the
    smallest value its init state may hold. ``types`` gives a column a type other than
    int64: ``decimal(p, s)`` or ``float64`` (contract §2).
    """

    name: str
    columns: tuple[str, ...]
    distinct: bool = False
    size_of: str | None = None
    init_min: int | None = None
    key: str = DENSE
    deletes: bool = False
    """Natural keys that are deleted, or whose existence is a condition (`Transactions.delete`,
    `Transactions.exists`): existence is then kept by operations. Else a committed create
    marks it after its chunk, at no operation's cost (`Transactions.created_cells`)."""
    types: dict[str, str] = field(default_factory=dict, hash=False)

    def __getitem__(self, column: str) -> Column:
        if column not in self.columns:
            raise TopologyError(f"table {self.name!r} has no column {column!r}")
        return Column(self, column)

    @property
    def natural(self) -> bool:
        """Whether its keys are natural (an index maps them to rows)."""
        return self.key in NATURAL

    @property
    def state_columns(self) -> tuple[str, ...]:
        """The columns the state holds: the value columns and, for natural keys, `LIVE`
        (1 for a key that exists)."""
        return (*self.columns, LIVE) if self.natural else self.columns

    @property
    def value_types(self) -> dict[str, ValueType]:
        """Every value column's type (TopologyError for a type that is not one)."""
        try:
            return {c: value_type(self.types.get(c, INT64)) for c in self.columns}
        except ValueError as exc:
            raise TopologyError(f"table {self.name!r}: {exc}") from None

    @property
    def live(self) -> Column:
        """The `LIVE` column of a table of natural keys."""
        if not self.natural:
            raise TopologyError(f"table {self.name!r} has dense keys, which always exist")
        return Column(self, LIVE)


@dataclass(frozen=True)
class Column:
    """One value column of a table: what an operation reads or writes."""

    table: Table
    name: str

    @property
    def type(self) -> ValueType:
        """Its value type (`LIVE`: int64)."""
        return self.table.value_types.get(self.name, ValueType())


# ---------------------------------------------------------------- user functions
@dataclass(eq=False)
class UserFunction:
    """A Python function the engine compiles with numba and calls from its kernels.

    ``computes`` says, for the library's own functions, which well-known computation it
    is (`txstream.state._kernels.VALUE_PLUS_ARG`, ...): kernels then do it inline
    instead of calling it (0: called, as every user function is).

    ``floating`` marks the variant of a function (``condition``: of a condition) for
    float64 columns (`on`)."""

    pyfunc: Callable[..., Any]
    compiled: Any = None
    computes: int = CALLED
    floating: bool = False
    condition: bool = False
    _on_floats: UserFunction | None = field(default=None, repr=False)

    @property
    def where(self) -> str:
        """``module:line`` of the definition, for error messages."""
        code = self.pyfunc.__code__
        return f"{self.pyfunc.__module__}:{code.co_firstlineno} ({self.pyfunc.__qualname__})"

    def compile(self) -> None:
        """Compile once to a C-callable function (cached on disk when possible)."""
        if self.compiled is None and self.floating:
            self.compiled = _on_floats(self.pyfunc, self.condition)
        elif self.compiled is None:
            cache = self.pyfunc.__module__ != "__main__"
            self.compiled = numba.cfunc(USER_SIG, cache=cache, nopython=True)(self.pyfunc)

    def on(self, of: ValueType, condition: bool = False) -> UserFunction:
        """This function (``condition``: this condition) as it acts on a column of type
        ``of``: on float64, a variant that sees floats (value, arguments and reads), unless
        it only moves a value (`identity`, `assign`), which its bits do as well."""
        if not of.floating or self.floating or self.computes in (VALUE, ARG):
            return self
        if self._on_floats is None:
            self._on_floats = UserFunction(self.pyfunc, floating=True, condition=condition)
        return self._on_floats

    @property
    def address(self) -> int:
        """Address of the compiled function, which kernels call."""
        return self.compiled.address


def _on_floats(pyfunc: Callable[..., Any], condition: bool) -> Any:
    """``pyfunc`` compiled on floats behind the int64 signature every kernel calls
    (`USER_SIG`): the state's bits in, the result's bits out (a condition's: 1 or 0)."""
    inner = numba.njit(inline="always")(pyfunc)

    def on_condition(value, args, reads, n_reads):
        ok = inner(bits_as_float(value), as_float_pointer(args), as_float_pointer(reads), n_reads)
        return 1 if ok else 0

    def on_function(value, args, reads, n_reads):
        result = inner(
            bits_as_float(value), as_float_pointer(args), as_float_pointer(reads), n_reads
        )
        return float_as_bits(np.float64(result))

    return numba.cfunc(USER_SIG, nopython=True)(on_condition if condition else on_function)


def function(pyfunc: Callable[[int, Any, Any, int], int]) -> UserFunction:
    """Declare ``fun(value, args, reads, n_reads) -> int``: the new value (WRITE,
    READ_MODIFY) or the result (READ) of an operation, from the target's current
    ``value``, the operation's ``args`` and its parametric ``reads`` (pointers: index
    them, see :data:`txstream.state._numba.USER_SIG`). On a float64 column, all of them
    are floats (`UserFunction.on`)."""
    return UserFunction(pyfunc)


def condition(pyfunc: Callable[[int, Any, Any, int], bool]) -> UserFunction:
    """Declare ``cond(value, args, reads, n_reads) -> bool``; the transaction aborts
    when it is false. Same arguments as :func:`function`."""
    return UserFunction(pyfunc)


def well_known(computes: int) -> Callable[[Callable[..., Any]], UserFunction]:
    """Declare one of the library's functions or conditions, which kernels compute
    inline (``computes``, see `UserFunction`); its Python body says the same, and is
    what a test compares them with."""
    return lambda pyfunc: UserFunction(pyfunc, computes=computes)


@well_known(VALUE)
def identity(value, args, reads, n_reads):
    """The value as it is: the default function of READ."""
    return value


@well_known(ARG)
def assign(value, args, reads, n_reads):
    """``args[0]``: a blind write."""
    return args[0]


@well_known(AT_LEAST_ARG)
def covers(value, args, reads, n_reads):
    """``value >= args[0]``: enough balance or quantity for the request."""
    return value >= args[0]


@condition
def within(value, args, reads, n_reads):
    """``-args[0] < value < args[0]``: a decimal inside its precision (``args[0]`` =
    `ValueType.limit`), checked after every computed write to a decimal column."""
    return -args[0] < value and value < args[0]


# ---------------------------------------------------------------- events
@dataclass(frozen=True)
class ListColumn:
    """A ``list<int64>`` column as CSR: ``values[offsets[i]:offsets[i+1]]`` is row i."""

    offsets: np.ndarray
    values: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """Length of every row's list."""
        return np.diff(self.offsets)


class EventShare:
    """A batch of events as numpy columns, plus the rejections found so far.

    Null scalars read as 0 and null lists as empty: validation decides what a null
    means for each kind, through :meth:`present` and :meth:`reject`.
    """

    def __init__(self, batch: pa.RecordBatch, topology: Topology, sizes: dict[str, int]):
        self.arrow = batch
        self.topology = topology
        self.sizes = sizes
        self.n = batch.num_rows
        self.reason = np.zeros(self.n, np.int32)  # 0 = not rejected
        self._cache: dict[str, Any] = {}

    # -- columns
    def int(self, name: str) -> np.ndarray:
        """An int64 column with nulls read as 0; a decimal column as integers of its scale,
        a value that does not fit it read as 0 (`require_decimal`)."""
        key = "int:" + name
        if key not in self._cache:
            col = self.arrow.column(name)
            if pa.types.is_decimal(col.type):
                values, self._cache["fits:" + name] = units(col, _decimal_of(col.type))
            elif pa.types.is_null(col.type):
                values = np.zeros(self.n, np.int64)
            elif col.null_count and col.type == pa.int64():
                # the valid values times their validity bits: cheaper than pyarrow's
                # fill_null(0), which builds a new column
                values = _buffer(col, 1, np.int64) * _valid_bits(col)
            else:
                col = col if col.null_count == 0 else col.fill_null(0)  # no copy when valid
                values = col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            self._cache[key] = values
        return self._cache[key]

    def float(self, name: str) -> np.ndarray:
        """A float64 column (integers widened) with nulls read as 0."""
        key = "float:" + name
        if key not in self._cache:
            col = self.arrow.column(name)
            if pa.types.is_null(col.type):
                values = np.zeros(self.n, np.float64)
            else:
                col = col if col.null_count == 0 else col.fill_null(0)
                values = col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
            self._cache[key] = values
        return self._cache[key]

    def list(self, name: str) -> ListColumn:
        """A list<int64> column as CSR, null lists empty and null elements 0."""
        key = "list:" + name
        if key not in self._cache:
            col = self.arrow.column(name)
            if pa.types.is_null(col.type):
                lst = ListColumn(np.zeros(self.n + 1, np.int64), np.zeros(0, np.int64))
            else:
                lst = _plain_csr(col) or _csr(col)
            self._cache[key] = lst
        return self._cache[key]

    def present(self, name: str) -> np.ndarray:
        """True where the field is not null (for a list: the list and all its elements)."""
        col = self.arrow.column(name)
        if pa.types.is_null(col.type):
            return np.zeros(self.n, bool)
        if col.null_count == 0 and not (self._is_list(name) and col.values.null_count):
            return np.ones(self.n, bool)
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        if self._is_list(name) and col.values.null_count:
            lst = self.list(name)
            bad_elem = col.flatten().is_null().to_numpy(zero_copy_only=False)
            if bad_elem.any():
                row = np.repeat(np.arange(self.n), lst.lengths)
                valid = valid & (np.bincount(row[bad_elem], minlength=self.n) == 0)
        return valid

    def kind(self, name: str) -> np.ndarray:
        """True where the event's ``kind`` is ``name``."""
        key = "kind:" + name
        if key not in self._cache:
            if name in self.topology.kinds:
                self._cache[key] = self.kind_codes() == self.topology.kinds.index(name)
            elif pa.types.is_null(self.arrow.column("kind").type):
                self._cache[key] = np.zeros(self.n, bool)
            else:
                eq = pc.equal(self.arrow.column("kind"), name)
                self._cache[key] = eq.fill_null(False).to_numpy(zero_copy_only=False)
        return self._cache[key]

    def kind_codes(self) -> np.ndarray:
        """Per event, the index of its ``kind`` in the topology's kinds (-1: null or
        unknown). The column is dictionary-encoded (`Topology.event_schema`): its few
        distinct strings are matched with numpy, and every event takes its dictionary
        entry's index (pyarrow's ``index_in`` compares every event's string; on the
        dictionary, each compute call makes a team's executor wait for the GIL, whose
        holder the spinning peers keep off the cores)."""
        key = "kind"
        if key not in self._cache:
            col = self.arrow.column("kind")
            if pa.types.is_null(col.type):
                codes = np.full(self.n, -1, np.int32)
            else:
                col = col if pa.types.is_dictionary(col.type) else col.dictionary_encode()
                entries = col.dictionary.to_numpy(zero_copy_only=False)
                by_entry = np.full(len(entries) + 1, -1, np.int32)
                for code, kind in enumerate(self.topology.kinds):
                    by_entry[:-1][entries == kind] = code
                indices = col.indices  # a null event points past the dictionary: -1
                indices = indices if indices.null_count == 0 else indices.fill_null(len(entries))
                codes = by_entry[indices.to_numpy(zero_copy_only=False)]
            self._cache[key] = codes
        return self._cache[key]

    # -- validation
    @property
    def rejected(self) -> np.ndarray:
        """True for the events rejected so far."""
        return self.reason != 0

    def reject(self, mask: np.ndarray, reason: str) -> None:
        """Reject the events in ``mask`` with ``reason`` (the first reason found is kept)."""
        if not mask.any():  # the usual case: one pass, not three
            return
        hit = mask & (self.reason == 0)
        if hit.any():
            self.reason[hit] = self.topology.reason_code(reason)

    def require_present(self, names: Sequence[str], where: np.ndarray | None = None) -> None:
        """Reject events in ``where`` with a null in any of ``names``."""
        for name in names:
            column = self.arrow.column(name)
            reason = f"null field: {name}"
            if self._is_list(name) or pa.types.is_null(column.type):
                if column.null_count or pa.types.is_null(column.type) or column.values.null_count:
                    self.reject(self._where(where) & ~self.present(name), reason)
            elif column.null_count:
                code = self.topology.reason_code(reason)
                valid = _readonly(_valid_bits(column))
                reject_unset(valid, self._mask(where), self.reason, code)

    def require_between(
        self, name: str, low: int, high: int | None, where: np.ndarray | None = None
    ) -> None:
        """Reject events in ``where`` whose field (every element, for a list) is outside
        ``low..high`` (``high=None``: no upper bound); a float64 one also when not a
        number."""
        reason = f"{name} out of range"
        if pa.types.is_floating(self.arrow.column(name).type):
            values = self.float(name)
            inside = (values >= low) & (values <= (np.inf if high is None else high))
            self.reject(self._where(where) & ~inside, reason)
            return
        high = INT64_MAX if high is None else high
        self._reject_outside(name, low, high, where, reason)

    def require_decimal(self, name: str, where: np.ndarray | None = None) -> None:
        """Reject events in ``where`` whose decimal field does not fit its column's type
        exactly (contract §2: more fractional digits than its scale, or more digits than
        its precision)."""
        self.int(name)
        self.reject(self._where(where) & ~self._cache["fits:" + name], f"inexact decimal: {name}")

    def require_key(self, name: str, table: Table, where: np.ndarray | None = None) -> None:
        """Reject events in ``where`` whose field is not a key of ``table``: outside
        ``0..K-1`` for dense keys, malformed (an empty string) for natural ones, whose
        field holds the key's row by now (`Topology.key_columns`)."""
        high = self.sizes[table.name] - 1
        reason = f"malformed key: {name}" if table.natural else f"key out of range: {name}"
        self._reject_outside(name, 0, high, where, reason)

    def _reject_outside(
        self, name: str, low: int, high: int, where: np.ndarray | None, reason: str
    ) -> None:
        code = self.topology.reason_code(reason)
        if self._is_list(name):
            lst = self.list(name)
            offsets, values = lst.offsets, lst.values
        else:
            offsets, values = _NO_ROWS, self.int(name)
        reject_outside(
            _readonly(offsets), _readonly(values), low, high, self._mask(where), self.reason, code
        )

    def require_kind(self) -> None:
        """Reject events whose ``kind`` is null or not one of the topology's kinds."""
        self.reject(self.kind_codes() < 0, "unknown kind")

    def _is_list(self, name: str) -> bool:
        return self.topology.event_columns[name] == INT_LIST

    def _where(self, where: np.ndarray | None) -> np.ndarray:
        return np.ones(self.n, bool) if where is None else where

    def _mask(self, where: np.ndarray | None) -> np.ndarray:
        """``where`` as the validation kernels take it (empty: every event)."""
        return _EVERY if where is None else _readonly(np.ascontiguousarray(where, bool))


def _decimal_of(arrow_type: pa.Decimal128Type) -> ValueType:
    return ValueType(arrow_type.precision, arrow_type.scale)


def _readonly(array: np.ndarray) -> np.ndarray:
    """A read-only view: what the validation kernels read is passed read-only, whether
    it was Arrow's memory (read-only) or a copy, so that each is compiled for one
    signature, the one the team's warm-up loads (`compile_validation`)."""
    if not array.flags.writeable:
        return array
    view = array.view()
    view.flags.writeable = False
    return view


def compile_validation() -> None:
    """Compile (or load from numba's cache) the validation kernels for the arguments
    `EventShare` passes them, before a run: an empty share reaches neither a null field
    nor every kind of column (`txstream.state._kernels.compile_for`)."""
    ints, flags = _readonly(np.zeros(1, np.int64)), _readonly(np.zeros(1, bool))
    reason = np.zeros(1, np.int32)
    compile_for(reject_outside, ints, ints, 0, 0, flags, reason, 0)
    compile_for(reject_unset, _readonly(np.zeros(1, np.uint8)), flags, reason, 0)


# ---------------------------------------------------------------- operations
Key = np.ndarray | ListColumn
Arg = np.ndarray | ListColumn | int


class Transactions:
    """Builds a batch's operations from vectorised statements (the TStream API's
    READ / WRITE / READ_MODIFY with optional condition, plus SET_ADD).

    A call records its statement as integers (what it emits; where its key, arguments
    and reads come from: columns by address, or constants), which the engine builds
    into operations in one kernel pass over the events
    (`txstream.schedulers.statements.Statements`). The columns the statements name are
    kept alive here.
    """

    def __init__(self, events: EventShare, layout: Layout):
        self.events = events
        self.layout = layout
        self.topology = events.topology
        self._statements: list[list[int]] = []
        self._args: list[tuple[int, int, int]] = []
        self._reads: list[tuple[int, ...]] = []
        self._targets: list[tuple[str, str]] = []
        self._alive: list[np.ndarray] = []
        self._width = 1
        self._creates: list[tuple[str, np.ndarray, np.ndarray | None]] = []
        """Creates marked after the chunk (`created_cells`): table, key rows, where."""
        self._float_outputs: set[str] = set()
        """The float64 outputs a statement reads into (`_check_output`)."""

    def read(self, column: Column, key: Key, *, fun: UserFunction = identity, **kw: Any) -> None:
        """Read ``column[key]`` through ``fun``; the result is added into output ``out``."""
        self._emit(READ, column, key, fun, **kw)

    def write(self, column: Column, key: Key, fun: UserFunction, **kw: Any) -> None:
        """``column[key] = fun(old, args, reads)``."""
        self._emit(WRITE, column, key, fun, **kw)

    def read_modify(self, column: Column, key: Key, fun: UserFunction, **kw: Any) -> None:
        """``column[key] = fun(old, args, reads)``; differs from WRITE in that the old
        value is part of the result (schedulers may not blind-write it)."""
        self._emit(READ_MODIFY, column, key, fun, **kw)

    def create(self, table: Table, key: np.ndarray, *, where: np.ndarray | None = None) -> None:
        """Make ``key`` of a table of natural keys exist if the transaction commits (an
        upsert: a key that did not exist has every column at 0, its default)."""
        if table.deletes:
            self._emit(WRITE, table.live, key, assign, args=(1,), where=where)
        else:
            self._creates.append((table.name, np.asarray(key, np.int64), where))

    def created_cells(self, status: np.ndarray) -> np.ndarray:
        """The existence cells of the keys that the committed transactions (their
        ``status``) created in tables without deletes, to be set after their chunk, before
        its snapshot, since no transaction reads their existence (`Table.deletes`)."""
        cells = []
        for table, key, where in self._creates:
            keys = np.empty(len(key), np.int64)
            mask = _EVERY if where is None else np.asarray(where, np.bool_)
            n = committed_keys(status, COMMITTED, key, mask, keys)
            cells.append(self.layout.cells_of(table, LIVE, keys[:n]))
        return np.concatenate(cells) if cells else np.zeros(0, np.int64)

    def delete(self, table: Table, key: Key, *, where: np.ndarray | None = None) -> None:
        """Remove ``key`` of a table of natural keys (declared with ``deletes``): it no
        longer exists, and its columns are back to 0 for a later `create`."""
        _needs_deletes(table, "delete")
        for column in table.columns:
            self._emit(WRITE, table[column], key, assign, args=(0,), where=where)
        self._emit(WRITE, table.live, key, assign, args=(0,), where=where)

    def exists(
        self, table: Table, key: Key, *, reason: str, where: np.ndarray | None = None
    ) -> None:
        """Abort the transaction with ``reason`` unless ``key`` exists (a missing key's
        columns read 0 otherwise); the table is declared with ``deletes``."""
        _needs_deletes(table, "exists")
        self._emit(
            READ, table.live, key, identity, args=(1,), cond=covers, reason=reason, where=where
        )

    def set_add(self, column: Column, key: Key, member: Arg, **kw: Any) -> None:
        """Add ``member`` to the set at ``key`` of a distinct table; the result is the size."""
        if not column.table.distinct:
            raise TopologyError(f"set_add needs a distinct table, {column.table.name!r} is not")
        self._emit(SET_ADD, column, key, identity, args=(member,), **kw)

    def _emit(
        self,
        kind: int,
        column: Column,
        key: Key,
        fun: UserFunction,
        *,
        args: Sequence[Arg] = (),
        reads: Sequence[tuple[Column, Key]] = (),
        cond: UserFunction | None = None,
        reason: str | None = None,
        out: str | None = None,
        where: np.ndarray | None = None,
    ) -> None:
        """One operation per selected event (``where``, not rejected), or per element
        of a list-valued key."""
        topo = self.topology
        if cond is not None and reason is None:
            raise TopologyError("a conditional operation needs a `reason` for its aborts")
        of = column.type
        if of.floating:
            fun, cond = fun.on(of), None if cond is None else cond.on(of, condition=True)
            args = [_float_arg(a) for a in args]
        if any(c.type.floating != of.floating for c, _ in reads):
            raise TopologyError("a function's parametric reads are of its column's type")
        if out is not None:
            self._check_output(out, of, key)
        if not isinstance(key, ListColumn) and any(isinstance(a, ListColumn) for a in args):
            raise TopologyError("a list argument needs a list-valued key")
        first_arg, first_read = len(self._args), len(self._reads)
        self._args += [self._source(a) for a in args]
        for read_column, read_key in reads:
            base, size, target = self._target(read_column)
            self._reads.append((base, size, *self._source(read_key), target))
        base, size, target = self._target(column)
        self._statements.append(
            [
                kind,
                topo.function_id(fun),
                0 if cond is None else topo.condition_id(cond),
                0 if reason is None else topo.reason_code(reason),
                -1 if out is None else topo.output_index(out),
                base,
                size,
                0 if where is None else self._address(where, bool),
                *self._source(key),
                first_arg,
                len(args),
                first_read,
                len(reads),
                target,
            ]
        )
        self._width = max(self._width, len(args))
        if of.decimal and kind in (WRITE, READ_MODIFY) and fun is not assign:
            self._emit(
                READ,
                column,
                key,
                identity,
                args=(of.limit,),
                cond=within,
                reason=DECIMAL_OVERFLOW,
                where=where,
            )

    def _check_output(self, out: str, of: ValueType, key: Key) -> None:
        """A float64 output reads a float64 column, one key of one statement: outputs add
        what they read, and a sum of floats would depend on its order."""
        wanted = self.topology.output_type(out)
        if wanted.floating != of.floating:
            raise TopologyError(f"output {out!r} is {wanted}, its column {of}")
        if wanted.floating:
            if isinstance(key, ListColumn) or out in self._float_outputs:
                raise TopologyError(f"float64 output {out!r}: one statement, one key")
            self._float_outputs.add(out)

    def _target(self, column: Column) -> tuple[int, int, int]:
        """(first cell, keys, index) of a column operations target or read; in a node's
        layout the first cell is 0: its keys are mapped to rows once operations are built."""
        pair = (column.table.name, column.name)
        if pair not in self._targets:
            self._targets.append(pair)
        base = 0 if self.layout.share else self.layout.bases[pair]
        return base, self.layout.sizes[column.table.name], self._targets.index(pair)

    def _source(self, value: Key | Arg) -> tuple[int, int, int]:
        """A key or an argument as the kernels take it (see `INT_COLUMN`)."""
        if isinstance(value, ListColumn):
            offsets = self._address(value.offsets, np.int64, self.events.n + 1)
            return LIST_COLUMN, offsets, self._address(value.values, np.int64, None)
        if np.ndim(value) == 0:
            return CONSTANT, int(value), 0
        return INT_COLUMN, self._address(value, np.int64), 0

    def _address(self, values: Any, dtype: type, length: int | None = -1) -> int:
        """The address of ``values`` as a C-contiguous array of ``dtype`` and ``length``
        elements (-1: one per event; None: any), kept alive for the kernels."""
        array = np.ascontiguousarray(values, dtype)
        length = self.events.n if length == -1 else length
        if array.ndim != 1 or (length is not None and len(array) != length):
            raise TopologyError(
                f"{self.topology.name}: state_access gave a column of shape {array.shape} "
                f"for {self.events.n} events"
            )
        self._alive.append(array)
        return array.ctypes.data


def _float_arg(arg: Arg) -> Arg:
    """An argument of an operation on a float64 column: its values' bits."""
    if isinstance(arg, ListColumn):
        return ListColumn(arg.offsets, float_bits(arg.values))
    if np.ndim(arg) == 0:
        return int(float_bits(arg))
    return float_bits(arg)


def _needs_deletes(table: Table, what: str) -> None:
    if not table.deletes:
        raise TopologyError(
            f"{what} on table {table.name!r}: declare it Table(..., deletes=True), whose "
            "operations keep whether a key exists"
        )


def _buffer(array: pa.Array, index: int, dtype: type) -> np.ndarray:
    """The elements of buffer ``index`` of ``array`` (a fixed-width one) as numpy, no copy."""
    values = np.frombuffer(array.buffers()[index], dtype)
    return values[array.offset : array.offset + len(array)]


def _valid_bits(array: pa.Array) -> np.ndarray:
    """1 where ``array`` is valid, 0 where null (uint8), from its validity bitmap."""
    bitmap = np.frombuffer(array.buffers()[0], np.uint8)
    bits = np.unpackbits(bitmap, count=array.offset + len(array), bitorder="little")
    return bits[array.offset :]


def _plain_csr(col: pa.ListArray) -> ListColumn | None:
    """The CSR of a list<int64> column without null elements whose null lists hold no
    elements (as Arrow builds them), with no copy of the elements; None otherwise
    (rebuilding it through ``flatten`` and ``fill_null`` copies every element)."""
    if col.type != LIST_INT64 or col.values.null_count:
        return None
    offsets = np.frombuffer(col.buffers()[1], np.int32)[col.offset : col.offset + len(col) + 1]
    if col.null_count and np.diff(offsets)[_valid_bits(col) == 0].any():
        return None
    start, end = int(offsets[0]), int(offsets[-1])
    values = _buffer(col.values, 1, np.int64)[start:end]
    return ListColumn(offsets.astype(np.int64) - start, values)


def _csr(col: pa.ListArray) -> ListColumn:
    """The CSR of any list column: null lists empty, null elements 0."""
    offsets = col.offsets.to_numpy().astype(np.int64)
    lengths = np.where(col.is_null().to_numpy(zero_copy_only=False), 0, np.diff(offsets))
    flat = col.flatten().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    # flatten() drops the elements of null lists; rebuild offsets from lengths.
    new_offsets = np.zeros(len(col) + 1, np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    return ListColumn(new_offsets, flat)


# ---------------------------------------------------------------- outputs
@dataclass
class Outputs:
    """Per-event results handed to ``post_process``: engine output columns and status.

    ``values[name]`` is int64 (float64 for a float64 output) and ``valid[name]`` says
    where it is set: a committed event that had an operation writing to that output.
    """

    status: np.ndarray
    values: dict[str, np.ndarray]
    valid: dict[str, np.ndarray]


def _pass_outputs(events: EventShare, outputs: Outputs) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {name: (outputs.values[name], outputs.valid[name]) for name in outputs.values}


# ---------------------------------------------------------------- topology
@dataclass(eq=False)
class Topology:
    """A complete, validated topology definition.

    Built once per process; building compiles every user function, so a function
    numba cannot compile is reported here, with all other problems, in one error.
    """

    name: str
    tables: tuple[Table, ...]
    event_columns: dict[str, str]
    kinds: tuple[str, ...]
    pre_process: Callable[[EventShare], None]
    state_access: Callable[[EventShare, Transactions], None]
    functions: tuple[UserFunction, ...] = ()
    conditions: tuple[UserFunction, ...] = ()
    outputs: tuple[str, ...] = ()
    post_process: Callable[[EventShare, Outputs], dict[str, tuple[np.ndarray, np.ndarray]]] = (
        _pass_outputs
    )
    output_columns: tuple[str, ...] | None = None
    output_types: dict[str, str] = field(default_factory=dict)
    """The output columns that are not int64, and their type (``decimal(p, s)``: the
    integers of its scale the operations give, as Arrow decimals; ``float64``)."""
    key_columns: dict[str, str] = field(default_factory=dict)
    """The event columns that carry keys of a table of natural keys, and the table's name:
    the engine turns them into rows before ``pre_process`` (contract §2)."""
    _reasons: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.functions = (identity, *[f for f in self.functions if f is not identity])
        if any(t.natural for t in self.tables):
            self.functions += tuple(f for f in (assign,) if f not in self.functions)
            self.conditions += tuple(c for c in (covers,) if c not in self.conditions)
        if self.decimals and within not in self.conditions:
            self.conditions += (within,)
        if self.floats:  # every function's variant for float64 columns, in a fixed order
            on = ValueType(floating=True)
            self.functions += tuple(f.on(on) for f in self.functions if f.on(on) is not f)
            self.conditions += tuple(
                c.on(on, True) for c in self.conditions if c.on(on, True) is not c
            )
        if self.output_columns is None:
            self.output_columns = self.outputs
        problems = []
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            problems.append(f"duplicate table names in {names}")
        for table in self.tables:
            if table.size_of is not None and table.size_of not in names:
                problems.append(f"table {table.name!r}: size_of {table.size_of!r} is not a table")
            if table.distinct and len(table.columns) != 1:
                problems.append(f"distinct table {table.name!r} must have exactly one column")
            if table.key not in KEY_TYPES:
                problems.append(
                    f"table {table.name!r}: key type {table.key!r} is not one of "
                    f"{', '.join(KEY_TYPES)}"
                )
            elif table.deletes and not table.natural:
                problems.append(f"table {table.name!r}: dense keys are never deleted")
            elif table.natural and (table.distinct or table.size_of is not None):
                problems.append(
                    f"table {table.name!r}: natural keys on a distinct table or "
                    "one sized after another"
                )
            if set(table.types) - set(table.columns):
                problems.append(f"table {table.name!r}: types of columns it does not have")
            try:
                _ = table.value_types
            except TopologyError as exc:
                problems.append(str(exc))
        by_name = {t.name: t for t in self.tables}
        for col, name in self.key_columns.items():
            table = by_name.get(name)
            wanted = STRING if table is not None and table.key == STRING_KEY else INT
            if table is None or not table.natural:
                problems.append(f"key column {col!r}: {name!r} is not a table of natural keys")
            elif self.event_columns.get(col) != wanted:
                problems.append(
                    f"key column {col!r} of {name!r} must be an event column of type {wanted}"
                )
        for col, typ in self.output_types.items():
            if col not in self.output_columns or not _value_column(typ):
                problems.append(
                    f"output type {col!r}: {typ!r} is not a decimal or float64 of an output"
                )
        for col, typ in self.event_columns.items():
            if typ not in (INT, STRING, INT_LIST) and not _value_column(typ):
                problems.append(f"event column {col!r}: unknown type {typ!r}")
        if self.kinds and self.event_columns.get("kind") != STRING:
            problems.append("a topology with kinds needs a string `kind` event column")
        if "event_id" not in self.event_columns:
            problems.append("events need an `event_id` column")
        first_error = None
        for fn in (*self.functions, *self.conditions):
            try:
                fn.compile()
            except Exception as exc:  # numba raises many error types
                first_error = first_error or exc
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                problems.append(f"user function {fn.where} does not compile: {msg}")
        if problems:
            raise TopologyError(f"topology {self.name!r}: " + "; ".join(problems)) from first_error
        self._reasons = {}

    # -- ids used by operations
    def function_id(self, fn: UserFunction) -> int:
        """Index of ``fn`` in :attr:`functions` (what the kernels dispatch on)."""
        for i, f in enumerate(self.functions):
            if f is fn:
                return i
        raise TopologyError(f"{self.name}: function {fn.where} is not in the topology's functions")

    def condition_id(self, cond: UserFunction) -> int:
        """1 + index of ``cond`` in :attr:`conditions` (0 means no condition)."""
        for i, c in enumerate(self.conditions):
            if c is cond:
                return i + 1
        raise TopologyError(f"{self.name}: condition {cond.where} is not in its conditions")

    def output_index(self, name: str) -> int:
        """Index of an output among the topology's outputs."""
        try:
            return self.outputs.index(name)
        except ValueError:
            raise TopologyError(f"{self.name}: unknown output {name!r}") from None

    def reason_code(self, reason: str) -> int:
        """A stable per-process code (>= 1) for a reason string."""
        code = self._reasons.get(reason)
        if code is None:
            code = self._reasons[reason] = len(self._reasons) + 1
        return code

    def reason_strings(self) -> list[str | None]:
        """Reason strings by code (index 0: no reason)."""
        out: list[str | None] = [None] * (len(self._reasons) + 1)
        for text, code in self._reasons.items():
            out[code] = text
        return out

    # -- what the engine needs from a definition
    def udf(self, spin_ns: int = 0) -> Udf:
        """The functions and conditions as kernels call them (by id), with ``spin_ns``
        of busy work added to every operation (``--udf-cost-us``)."""
        return Udf(
            np.array([f.address for f in self.functions], np.int64),
            np.array([0, *(c.address for c in self.conditions)], np.int64),  # 0: none
            spin_ns,
            np.array([f.computes for f in self.functions], np.int64),
            np.array([0, *(c.computes for c in self.conditions)], np.int64),
        )

    @property
    def init_tables(self) -> tuple[Table, ...]:
        """Tables whose init state is read from a file."""
        return tuple(t for t in self.tables if t.size_of is None)

    def sizes_from(self, init_sizes: dict[str, int]) -> dict[str, int]:
        """Size of every table given the sizes of the init tables."""
        sizes = dict(init_sizes)
        for t in self.tables:
            if t.size_of is not None:
                sizes[t.name] = init_sizes[t.size_of]
        return sizes

    def output_type(self, name: str) -> ValueType:
        """The type of output column ``name``."""
        return value_type(self.output_types.get(name, INT64))

    @property
    def floats(self) -> bool:
        """Whether a table has a float64 column."""
        return any(t.floating for table in self.tables for t in table.value_types.values())

    @property
    def decimals(self) -> bool:
        """Whether a table has a decimal column."""
        return any(t.decimal for table in self.tables for t in table.value_types.values())

    @property
    def event_schema(self) -> pa.Schema:
        """The event columns with their canonical Arrow types (what the engine reads); a
        decimal column as ``decimal128(p, s)``, a float64 one as float64."""
        types = {INT: pa.int64(), STRING: DICTIONARY_STRING, INT_LIST: LIST_INT64}
        return pa.schema(
            [
                (name, types[typ] if typ in types else value_type(typ).arrow)
                for name, typ in self.event_columns.items()
            ]
        )

    @property
    def marks_created(self) -> bool:
        """Whether a chunk's creates are marked after it (`Transactions.created_cells`)."""
        return any(t.natural and not t.deletes for t in self.tables)

    @property
    def engine_schema(self) -> pa.Schema:
        """The event columns as the team gets them: `event_schema` with the key columns of
        tables of natural keys turned into int64 rows (`key_columns`)."""
        schema = self.event_schema
        for name in self.key_columns:
            schema = schema.set(schema.get_field_index(name), pa.field(name, pa.int64()))
        return schema

    def on_rows(self) -> Topology:
        """The topology as it gets events whose key columns are rows already (`engine_schema`):
        what a node of a run over several runs, the driver holding the key index."""
        if not self.key_columns:
            return self
        columns = {
            name: INT if name in self.key_columns else typ
            for name, typ in self.event_columns.items()
        }
        return replace(self, event_columns=columns, key_columns={})

    def check_event_schema(self, schema: pa.Schema) -> None:
        """Raise :class:`SchemaError` unless every declared event column has a usable type."""
        for name, typ in self.event_columns.items():
            if name not in schema.names:
                raise SchemaError(f"events: missing column {name!r}")
            actual = schema.field(name).type
            if pa.types.is_null(actual):
                continue
            ok = {
                INT: pa.types.is_integer(actual),
                STRING: _is_string(actual)
                or (pa.types.is_dictionary(actual) and _is_string(actual.value_type)),
                INT_LIST: (pa.types.is_list(actual) or pa.types.is_large_list(actual))
                and (pa.types.is_integer(actual.value_type) or pa.types.is_null(actual.value_type)),
            }.get(typ, is_float_input(actual) if typ == FLOAT else is_decimal_input(actual))
            if not ok:
                raise SchemaError(f"events: column {name!r} has type {actual}, expected {typ}")


def _value_column(typ: str) -> bool:
    """Whether a declared type is a decimal or float64 one."""
    try:
        of = value_type(typ)
    except ValueError:
        return False
    return of.decimal or of.floating


def _is_string(arrow_type: pa.DataType) -> bool:
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def one_batch(events: pa.Table | pa.RecordBatch) -> pa.RecordBatch:
    """``events`` as one record batch (a copy only if they span several)."""
    if isinstance(events, pa.RecordBatch):
        return events
    batches = events.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=events.schema)


def own_memory(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` in memory of its own: a copy if it is a slice of a batch over twice its
    size, whose pickle would carry all of that batch."""
    if batch.get_total_buffer_size() > 2 * batch.nbytes:
        return pa.concat_batches([batch])
    return batch


def conform_events(events: pa.Table | pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    """``events`` with exactly the columns of ``schema``, in its order and types (integers
    of any width widened, all-null columns typed); other columns are dropped. Batches of
    every push then concatenate into one chunk. A decimal column is converted exactly,
    event by event (`txstream.state.values.exact_decimals`)."""
    table = events if isinstance(events, pa.Table) else pa.Table.from_batches([events])
    table = table.select(schema.names)
    for i, target in enumerate(schema):
        actual = table.schema.field(i).type
        if pa.types.is_decimal(target.type) and actual != target.type and is_decimal_input(actual):
            column = exact_decimals(table.column(i), _decimal_of(target.type))
            table = table.set_column(i, target.name, column)
    return table if table.schema.equals(schema) else table.cast(schema)
