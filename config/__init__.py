"""Warren's configuration: RabbitMQ's rabbitmq.conf format, read into :class:`Settings`."""

from config.parser import ConfigError, load_settings, parse_config
from config.settings import Listener, Settings

__all__ = ["ConfigError", "Listener", "Settings", "load_settings", "parse_config"]
