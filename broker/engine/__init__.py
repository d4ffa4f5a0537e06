"""The engine: vhosts, exchanges, queues, consumers, channels, messages, confirms, deadlines,
dead-lettering, policy, users. Imports no ops, tools, testkit or pipeline (import contracts)."""
