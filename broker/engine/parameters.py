"""Runtime parameters: values per (vhost, component, name), durable, with a component registry.

RabbitMQ keeps them in its metadata store (rabbit_runtime_parameters); a plugin
registers a component that validates and acts on its values (the shovel plugin's
``shovel``). Warren does the same: a component registered here is asked to
validate every value before it is stored and told when one is set or cleared.
The federation plugin's components, which Warren does not run, are stored, listed and
exported as given and act on nothing (STORED_ONLY); any other component nobody
registered is refused as RabbitMQ refuses it (rabbit_runtime_parameters:lookup_component/1:
"component ~s not found").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from warren.broker.engine.persistence import Persistence

Key = tuple[str, str, str]  # (vhost, component, name)

# components of RabbitMQ plugins Warren does not run: kept so that definitions carry them
STORED_ONLY = frozenset({"federation-upstream", "federation-upstream-set"})


class ParameterError(Exception):
    """A value a component refuses; the message is what the API returns with its 400."""


class Component(Protocol):
    """What a component registers: its name and three hooks."""

    name: str

    def validate(self, vhost: str, name: str, value: Any) -> None:
        """Raise ParameterError if ``value`` cannot be set (nothing is stored then)."""

    def on_set(self, vhost: str, name: str, value: Any) -> None:
        """The value is stored (new or replaced); also called for stored values at start."""

    def on_clear(self, vhost: str, name: str) -> None:
        """The value is gone (cleared, or its vhost deleted)."""


class Parameters:
    def __init__(self) -> None:
        self.values: dict[Key, Any] = {}
        self.components: dict[str, Component] = {}
        self.persistence: Persistence | None = None

    def register(self, component: Component) -> None:
        """Add a component; values already stored for it (restored at start) are handed over."""
        self.components[component.name] = component
        for (vhost, comp, name), value in list(self.values.items()):
            if comp == component.name:
                component.on_set(vhost, name, value)

    def unregister(self, name: str) -> None:
        self.components.pop(name, None)

    def get(self, vhost: str, component: str, name: str) -> Any | None:
        return self.values.get((vhost, component, name))

    def list(self, component: str | None = None, vhost: str | None = None) -> list[Key]:
        return [
            key
            for key in self.values
            if (component is None or key[1] == component) and (vhost is None or key[0] == vhost)
        ]

    def set(self, vhost: str, component: str, name: str, value: Any, persist: bool = True) -> bool:
        """Validate, store and announce a value; True if it is new. Raises ParameterError."""
        handler = self.components.get(component)
        if handler is not None:
            handler.validate(vhost, name, value)
        elif component not in STORED_ONLY and persist:  # a stored one is restored as it is
            raise ParameterError(f"component {component} not found")
        key = (vhost, component, name)
        new = key not in self.values
        self.values[key] = value
        if persist and self.persistence is not None:
            self.persistence.definitions.save_parameter(vhost, component, name, value)
        if handler is not None:
            handler.on_set(vhost, name, value)
        return new

    def clear(self, vhost: str, component: str, name: str) -> bool:
        """Remove a value; False if there was none."""
        if self.values.pop((vhost, component, name), _MISSING) is _MISSING:
            return False
        if self.persistence is not None:
            self.persistence.definitions.delete_parameter(vhost, component, name)
        handler = self.components.get(component)
        if handler is not None:
            handler.on_clear(vhost, name)
        return True

    def vhost_deleted(self, vhost: str) -> None:
        """A deleted vhost's parameters go with it (its store rows go with the vhost's)."""
        for key in [k for k in self.values if k[0] == vhost]:
            del self.values[key]
            handler = self.components.get(key[1])
            if handler is not None:
                handler.on_clear(vhost, key[2])


_MISSING = object()
