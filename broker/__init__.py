"""Warren's broker, by concern: engine/, store/, streams/, tracing/, server/ (the asyncio
shell), ops/ (management, console, metrics), tools/ and testkit/."""
