"""Checks of a DataFrame's columns against a write plan (driver side), so
that a wrong column fails before any task starts."""

from __future__ import annotations

from pyspark.sql import types as T

from ..errors import InvalidInput
from .options import WritePlan

HEADER_TYPES = (
    T.StringType,
    T.BooleanType,
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.FloatType,
    T.DoubleType,
    T.DecimalType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
)
ID_TYPES = (T.StringType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType)


def check_schema(schema: T.StructType, plan: WritePlan) -> None:
    fields = {f.name: f.dataType for f in schema.fields}

    def field(name: str, role: str) -> T.DataType:
        if name not in fields:
            raise InvalidInput(f"{role} {name!r} is not a column of the DataFrame (columns: {', '.join(fields)})")
        return fields[name]

    vtype = field(plan.value_col, "value_col")
    if not isinstance(vtype, (T.BinaryType, T.StringType)):
        raise InvalidInput(
            f"value column {plan.value_col!r} is {vtype.simpleString()}: it must be binary or string "
            "(serialise it first, e.g. with to_json)"
        )
    if plan.id_col is not None:
        itype = field(plan.id_col, "id_col")
        if not isinstance(itype, ID_TYPES):
            raise InvalidInput(
                f"id column {plan.id_col!r} is {itype.simpleString()}: it must be a string or an integer"
            )
    if plan.label_col is not None:
        field(plan.label_col, "label_col")
    for h in plan.headers:
        htype = field(h, "header column")
        if not isinstance(htype, HEADER_TYPES):
            raise InvalidInput(
                f"header column {h!r} is {htype.simpleString()}: it must be a string, number, boolean, "
                "date or timestamp (headers are str to str)"
            )
