"""Streams: the stream log (segment files, chunks, retention) and the stream queue type.
Must not import ops, tools, testkit or pipeline."""
