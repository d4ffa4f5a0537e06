"""Operating Warren: the management HTTP API, Prometheus metrics and definitions.

``core.Management`` holds what they share; ``api.management_app`` builds the
HTTP API. Nothing here is imported unless management, metrics or definitions
are configured (aiohttp costs start-up time).
"""
