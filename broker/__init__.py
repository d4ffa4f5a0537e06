"""Warren's engine: vhosts, exchanges, queues, channels and connections, and the asyncio server."""
