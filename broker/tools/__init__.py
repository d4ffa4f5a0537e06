"""Client tools that talk to a running broker: ``warrenctl`` and ``warren-healthcheck``."""

# written by warren-server in its data dir while it runs; how warrenctl finds it
ENDPOINTS_FILE = "warren-endpoints.json"
