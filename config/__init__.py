"""Warren's configuration: RabbitMQ's rabbitmq.conf format, read into :class:`Settings`."""

from warren.config.parser import ConfigError, load_settings, parse_config
from warren.config.settings import Listener, Settings

__all__ = ["ConfigError", "Listener", "Settings", "load_settings", "parse_config"]
