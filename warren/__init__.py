"""Warren: an AMQP 0-9-1 broker that existing RabbitMQ clients use unchanged.

The installed package holds the repository's top-level folders as
subpackages: ``warren.protocol`` (sans-IO codec and state), ``warren.broker``
(the engine, the asyncio server, ``tools`` and ``testkit``), ``warren.config``
(rabbitmq.conf parsing) and ``warren.pipeline`` (the PySpark trace report).
"""

__version__ = "0.1.0"
