"""Operations: the management HTTP API, the web console, Prometheus metrics.
Must not import tools or pipeline (testkit only for the test API's vhost reset)."""
