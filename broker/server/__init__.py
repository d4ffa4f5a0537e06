"""The asyncio shell: listeners, the AMQP connection, flow control, logging, the entry point.
Must not import testkit or pipeline (tools only for the endpoints file's name)."""
