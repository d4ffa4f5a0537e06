"""Client tools that talk to a running broker: ``warrenctl`` and ``warren-healthcheck``."""
