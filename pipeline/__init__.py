"""warren-report: a PySpark job over Warren's message-lifecycle traces (broker/tracing/tracer.py).

``pipeline.job`` reads the trace files and computes the tables, ``pipeline.report`` turns
them into one HTML page and a terminal summary, ``pipeline.generate`` writes synthetic
traces for scale runs and tests. Nothing here is imported by the broker.
"""
