"""Global runtime parameters (``cluster_name`` and any other name): a name and a JSON value.

RabbitMQ keeps them beside the vhost-scoped ones (rabbit_runtime_parameters:set_global/3);
Warren stores them with the definitions and returns them as given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warren.broker.engine.persistence import Persistence


class GlobalParameters:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.persistence: Persistence | None = None

    def set(self, name: str, value: Any, persist: bool = True) -> bool:
        """Store a value; True if it is new."""
        new = name not in self.values
        self.values[name] = value
        if persist and self.persistence is not None:
            self.persistence.definitions.save_global_parameter(name, value)
        return new

    def clear(self, name: str) -> bool:
        if name not in self.values:
            return False
        del self.values[name]
        if self.persistence is not None:
            self.persistence.definitions.delete_global_parameter(name)
        return True
