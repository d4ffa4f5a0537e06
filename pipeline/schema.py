"""The trace's schema as Spark reads its decoded JSON lines: every field of every event,
all nullable.

Derived from the trace's declaration of its fields (broker/tracing/schema.py) and given to
the reader explicitly: inferring a schema means one extra pass over the whole trace.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from warren.broker.tracing.schema import BOOL, FIELDS, INT, LONG, LONGS, STRING, STRINGS

_TYPES = {
    LONG: LongType(),
    INT: IntegerType(),
    STRING: StringType(),
    BOOL: BooleanType(),
    STRINGS: ArrayType(StringType()),
    LONGS: ArrayType(LongType()),
}
_FIELDS: list[tuple[str, object]] = [(name, _TYPES[kind]) for name, kind in FIELDS.items()]
# the line's place in its session's stream (job._decode adds it)
_FIELDS.insert(1, ("n", LongType()))

TRACE_SCHEMA = StructType([StructField(name, kind, True) for name, kind in _FIELDS])  # type: ignore[arg-type]
# as decoded file by file: a delivery's channel, to settle acks that fall in a later file
READ_SCHEMA = StructType([*TRACE_SCHEMA.fields, StructField("chan", StringType(), True)])

# the dead-letter reasons RabbitMQ and Warren use: one column each in the per-minute table
DEAD_LETTER_REASONS = ("expired", "rejected", "maxlen", "delivery_limit")
