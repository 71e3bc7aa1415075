"""Value types of table columns: int64, exact decimals held as int64 integers of the
column's scale (contract §2), so that money never goes through a float and the kernels add
and compare them as they do any integer, and float64 held as its bits in an int64 cell, so
that one state array, one log and one checkpoint format serve every column (the functions
of a float64 column see floats: `txstream.topologies.api.UserFunction.on`).

A decimal crosses the boundary as Arrow's ``decimal128(p, s)``: events and init state are
converted to it exactly, element by element (`exact_decimals`), and the state's integers
are turned back into it where tables leave the engine (`typed_table`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

INT64 = "int64"
FLOAT64 = "float64"
MAX_PRECISION = 18
"""Digits a decimal may have: every value of 18 digits, and the sum or difference of two
of them, fits in an int64."""
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")
DECIMAL_OVERFLOW = "decimal overflow"
"""The reason of a transaction aborted by a result outside its column's precision."""


@dataclass(frozen=True)
class ValueType:
    """A column's type: int64 (``precision`` 0), ``decimal(precision, scale)`` or
    float64 (``floating``)."""

    precision: int = 0
    scale: int = 0
    floating: bool = False

    @property
    def decimal(self) -> bool:
        """Whether it is a decimal."""
        return self.precision > 0

    @property
    def arrow(self) -> pa.DataType:
        """How its values leave the engine."""
        if self.floating:
            return pa.float64()
        return pa.decimal128(self.precision, self.scale) if self.decimal else pa.int64()

    @property
    def limit(self) -> int:
        """Every value held is strictly between ``-limit`` and ``limit``, in units of the
        scale."""
        return 10**self.precision

    def __str__(self) -> str:
        if self.floating:
            return FLOAT64
        return f"decimal({self.precision},{self.scale})" if self.decimal else INT64


def value_type(text: str) -> ValueType:
    """The type ``text`` names (``int64``, ``float64`` or ``decimal(p, s)``, ``1 <= p <= 18``,
    ``s <= p``); ValueError otherwise."""
    if text == INT64:
        return ValueType()
    if text == FLOAT64:
        return ValueType(floating=True)
    match = _DECIMAL.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not int64, float64 or decimal(p, s)")
    precision, scale = int(match[1]), int(match[2])
    if not 1 <= precision <= MAX_PRECISION or scale > precision:
        raise ValueError(f"{text!r}: a decimal has 1 to {MAX_PRECISION} digits, scale <= digits")
    return ValueType(precision, scale)


def is_float_input(arrow_type: pa.DataType) -> bool:
    """Whether a column of ``arrow_type`` can be read as float64: integers or floats."""
    return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)


def float_bits(values: np.ndarray | float) -> np.ndarray:
    """float64 ``values`` as the int64 bits the state holds them as."""
    return np.asarray(values, np.float64).view(np.int64)


def bits_float(bits: np.ndarray) -> np.ndarray:
    """The float64 values of the int64 ``bits`` the state holds (`float_bits`)."""
    return np.asarray(bits, np.int64).view(np.float64)


def is_decimal_input(arrow_type: pa.DataType) -> bool:
    """Whether a column of ``arrow_type`` can be read as a decimal: integers or decimals."""
    return pa.types.is_integer(arrow_type) or pa.types.is_decimal(arrow_type)


def exact_decimals(column: pa.Array | pa.ChunkedArray, to: ValueType) -> pa.ChunkedArray:
    """``column`` (integers or decimals of any precision and scale) as ``to.arrow``; a
    value that does not fit it exactly (more fractional digits than its scale, or more
    digits than its precision) is held as ``to.limit`` units, out of its range, which
    `units` reports. Nulls stay null."""
    chunked = column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column])
    if chunked.type == to.arrow:
        return chunked
    return pa.chunked_array([_exact_chunk(chunk, to) for chunk in chunked.chunks], to.arrow)


def _exact_chunk(chunk: pa.Array, to: ValueType) -> pa.Array:
    if pa.types.is_integer(chunk.type):
        chunk = pc.cast(chunk, pa.decimal128(20, 0))
    if not pa.types.is_decimal(chunk.type):
        raise TypeError(f"{chunk.type} is not a decimal")
    exact = np.ones(len(chunk), bool)
    if chunk.type.scale > to.scale:  # truncated, and exact where nothing was cut off
        cut = pc.cast(chunk, pa.decimal128(chunk.type.precision, to.scale), safe=False)
        same = pc.equal(pc.cast(cut, chunk.type), chunk).fill_null(True)
        exact = same.to_numpy(zero_copy_only=False)
        chunk = cut
    digits = min(38, chunk.type.precision - chunk.type.scale + to.scale)
    wide = pc.cast(chunk, pa.decimal128(max(digits, 1), to.scale))
    words = _words(wide)
    low, high = words[:, 0], words[:, 1]
    fits = (
        exact & (high == (low >> 63)) & (np.abs(low) < to.limit) & (low != np.iinfo(np.int64).min)
    )
    low = np.where(fits, low, to.limit)
    return decimal_array(low, to, wide.is_valid().to_numpy(zero_copy_only=False))


def units(column: pa.Array, of: ValueType) -> tuple[np.ndarray, np.ndarray]:
    """(values, fits) of a ``decimal128`` column of type ``of`` (`exact_decimals`): its
    values as int64 integers of the scale (nulls and values out of range 0), and whether
    each fits (null: it does)."""
    words = _words(column)
    low, high = words[:, 0], words[:, 1]
    fits = (high == (low >> 63)) & (np.abs(low) < of.limit) & (low != np.iinfo(np.int64).min)
    if column.null_count:
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        fits |= ~valid
        return np.where(valid & fits, low, 0), fits
    return np.where(fits, low, 0), fits


def typed_table(table: pa.Table, types: dict[str, ValueType]) -> pa.Table:
    """``table`` with its decimal columns (int64 integers of their scale) as Arrow
    decimals of their type, its float64 ones (their bits) as floats."""
    for name, of in types.items():
        if (of.decimal or of.floating) and name in table.column_names:
            values = table.column(name).to_numpy()
            column = pa.array(bits_float(values)) if of.floating else decimal_array(values, of)
            table = table.set_column(table.schema.get_field_index(name), name, column)
    return table


def _words(column: pa.Array) -> np.ndarray:
    """The 128-bit values of a decimal128 column as rows of (low, high) int64 words."""
    words = np.frombuffer(column.buffers()[1], np.int64).reshape(-1, 2)
    return words[column.offset : column.offset + len(column)]


def decimal_array(values: np.ndarray, of: ValueType, valid: np.ndarray | None = None) -> pa.Array:
    """A ``decimal128`` column of ``values`` (int64 integers of the scale), null where not
    ``valid``."""
    words = np.empty((len(values), 2), np.int64)
    words[:, 0] = values
    words[:, 1] = values >> 63
    mask = (
        None
        if valid is None or valid.all()
        else pa.py_buffer(np.packbits(valid, bitorder="little"))
    )
    return pa.Array.from_buffers(of.arrow, len(values), [mask, pa.py_buffer(words)])
