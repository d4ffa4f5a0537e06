"""The engine: vhosts, exchanges, queues, consumers, channels, messages, confirms, deadlines,
dead-lettering, policy, users. Must not import ops, tools, testkit (until #42 step 4), pipeline."""
