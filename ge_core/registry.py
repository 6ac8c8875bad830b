"""Named registries whose entries remember which plugin registered them."""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from .errors import DuplicateRegistrationError, GEError

T = TypeVar("T")


def close_matches(name: str, names, n: int = 3) -> str:
    """A ' (did you mean: a, b?)' suffix, or ''."""
    m = difflib.get_close_matches(str(name), [str(x) for x in names], n=n, cutoff=0.5)
    return f" (did you mean: {', '.join(m)}?)" if m else ""


class Registry(Generic[T]):
    """A mapping of key to object plus the plugin that registered it.

    Registering a key twice raises :class:`DuplicateRegistrationError` naming both plugins.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[Hashable, T] = {}
        self._origin: dict[Hashable, str] = {}

    def add(self, key: Hashable, obj: T, plugin: str) -> None:
        if key in self._items:
            raise DuplicateRegistrationError(
                f"{self.kind} '{_fmt(key)}' is registered by both plugin '{self._origin[key]}' "
                f"and plugin '{plugin}'",
                hint="disable one of them with GE_DISABLE_PLUGINS or rename the entry",
            )
        self._items[key] = obj
        self._origin[key] = plugin

    def get(self, key: Hashable) -> T | None:
        return self._items.get(key)

    def require(self, key: Hashable, error: type[GEError] = GEError, what: str = "") -> T:
        """The entry for ``key`` or an error listing close matches."""
        try:
            return self._items[key]
        except KeyError:
            names = [_fmt(k) for k in self._items]
            raise error(
                f"no {self.kind} named '{_fmt(key)}'{what}{close_matches(_fmt(key), names)}",
                hint=f"known: {', '.join(sorted(names)) or 'none'}",
            ) from None

    def origin(self, key: Hashable) -> str | None:
        return self._origin.get(key)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self):
        return self._items.items()

    def keys(self):
        return self._items.keys()

    def values(self):
        return self._items.values()


def _fmt(key: Hashable) -> str:
    if isinstance(key, tuple):
        return "::".join(str(k) for k in key if k != "") or str(key)
    return str(key)
