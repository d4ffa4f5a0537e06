"""Dynamic shovels: RabbitMQ's ``shovel`` runtime parameter, run by Warren itself.

``definition`` reads and checks a shovel's JSON, ``client`` is the AMQP 0-9-1 client a
shovel connects with, ``worker`` the parameter component and one asyncio task per shovel.
"""

from warren.broker.ops.shovel.worker import Shovels

__all__ = ["Shovels"]
