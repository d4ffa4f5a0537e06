"""Warren: an AMQP 0-9-1 broker that existing RabbitMQ clients use unchanged.

The installed package holds the repository's top-level folders as
subpackages: ``warren.protocol`` (sans-IO codec and state), ``warren.broker``
(the engine, the store, streams, tracing, the asyncio server,
operations, ``tools`` and ``testkit``), ``warren.config``
(rabbitmq.conf parsing) and ``warren.pipeline`` (the PySpark trace report).
"""

import os
from importlib.machinery import EXTENSION_SUFFIXES

__version__ = "0.1.0"

# the folders that hold modules setup.py may compile
PACKAGES = (
    "protocol",
    "broker",
    "broker/engine",
    "broker/server",
    "broker/store",
    "broker/streams",
    "broker/testkit",
    "broker/tracing",
    "config",
)


def build() -> str:
    """``compiled`` when the message path runs as mypyc's C extensions, else ``pure``."""
    return "compiled" if compiled_modules() else "pure"


def compiled_modules() -> list[str]:
    """The modules that run as C extensions built by mypyc (the default build, see
    setup.py); empty for a pure-Python install. Python imports an extension before the
    .py file of the same name in the same folder, so being there is being used."""
    here = os.path.dirname(__file__)
    found = []
    for package in PACKAGES:
        for name in os.listdir(os.path.join(here, package)):
            for suffix in EXTENSION_SUFFIXES:
                if name.endswith(suffix):
                    found.append(f"{package.replace('/', '.')}.{name[: -len(suffix)]}")
                    break
    return sorted(found)
