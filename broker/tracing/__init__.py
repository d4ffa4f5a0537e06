"""Tracing: the tracer's hooks, the hand-over to the writer process, the trace format, the
firehose. Must not import ops, tools, testkit or pipeline."""
