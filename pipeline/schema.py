"""The trace's schema as Spark reads its decoded JSON lines: every field of every event,
all nullable.

Kept in one place, and given to the reader explicitly: inferring a schema means one
extra pass over the whole trace. The events and their fields are listed in
broker/tracing/tracer.py.
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

_FIELDS: tuple[tuple[str, object], ...] = (
    ("ts", LongType()),  # microseconds since the epoch
    ("n", LongType()),  # the line's place in its session's stream (job._decode adds it)
    ("ev", StringType()),
    ("vhost", StringType()),
    ("msg", LongType()),
    ("queue", StringType()),
    ("exchange", StringType()),
    ("rk", StringType()),
    ("size", LongType()),
    ("mid", StringType()),
    ("cid", StringType()),
    ("persistent", BooleanType()),
    ("conn", StringType()),
    ("ch", IntegerType()),
    ("seq", LongType()),
    ("first", LongType()),
    ("ack", BooleanType()),
    ("queues", ArrayType(StringType())),
    ("mandatory", BooleanType()),
    ("dead_letter", BooleanType()),
    ("consumer", StringType()),
    ("tag", LongType()),
    ("redelivered", BooleanType()),
    ("count", IntegerType()),
    ("no_ack", BooleanType()),
    ("requeue", BooleanType()),
    ("why", StringType()),
    ("attempt", IntegerType()),
    ("delay_ms", LongType()),
    ("reason", StringType()),
    ("dlx", StringType()),
    ("dlrk", StringType()),
    ("prefetch", IntegerType()),
    ("tags", ArrayType(LongType())),
    ("msgs", ArrayType(LongType())),
    ("timeout_ms", LongType()),
    ("action", StringType()),
    ("messages", LongType()),
    ("dropped", LongType()),
)

TRACE_SCHEMA = StructType([StructField(name, kind, True) for name, kind in _FIELDS])  # type: ignore[arg-type]
# as decoded file by file: a delivery's channel, to settle acks that fall in a later file
READ_SCHEMA = StructType([*TRACE_SCHEMA.fields, StructField("chan", StringType(), True)])

# the dead-letter reasons RabbitMQ and Warren use: one column each in the per-minute table
DEAD_LETTER_REASONS = ("expired", "rejected", "maxlen", "delivery_limit")
