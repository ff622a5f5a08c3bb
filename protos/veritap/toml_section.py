"""Typed, validated reading of one TOML table, with errors that name the bad key.

A daemon's config loader walks its section with a `Section`, asking for each key with
its type and default; `finish()` then rejects any key nobody asked for, so a typo is an
error at start rather than a silently ignored setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type, out of range or unknown."""


class Section:
    """One TOML table (`name` is its dotted path, used in messages)."""

    def __init__(self, table: Mapping[str, object], name: str, *, base_dir: Path) -> None:
        self._table = table
        self._name = name
        self._base_dir = base_dir
        self._seen: set[str] = set()

    def _key(self, key: str) -> str:
        return f"{self._name}.{key}" if self._name else key

    def _raw(self, key: str) -> object | None:
        self._seen.add(key)
        return self._table.get(key)

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self._key(key)}: {message}")

    def has(self, key: str) -> bool:
        return key in self._table

    def string(self, key: str, default: str) -> str:
        value = self._raw(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {type(value).__name__}")
        return value

    def optional_string(self, key: str) -> str | None:
        value = self._raw(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise self.error(key, "expected a non-empty string")
        return value

    def integer(
        self, key: str, default: int, *, minimum: int = 0, maximum: int | None = None
    ) -> int:
        value = self._raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {type(value).__name__}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
            raise self.error(key, f"must be {bound}, got {value}")
        return value

    def number(self, key: str, default: float, *, minimum: float = 0.0) -> float:
        value = self._raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, f"expected a number, got {type(value).__name__}")
        if value < minimum:
            raise self.error(key, f"must be >= {minimum}, got {value}")
        return float(value)

    def optional_path(self, key: str) -> Path | None:
        """A path; relative paths are taken relative to the config file's folder."""
        text = self.optional_string(key)
        if text is None:
            return None
        path = Path(text).expanduser()
        return path if path.is_absolute() else self._base_dir / path

    def strings(self, key: str) -> tuple[str, ...]:
        value = self._raw(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.error(key, "expected a list of non-empty strings")
        return tuple(str(v) for v in value)

    def tables(self, key: str) -> list[Section]:
        """An array of tables (`[[name.key]]`), each as its own Section."""
        value = self._raw(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.error(key, "expected an array of tables")
        return [
            Section(v, f"{self._key(key)}[{i}]", base_dir=self._base_dir)
            for i, v in enumerate(value)
        ]

    def finish(self) -> None:
        """Reject keys that no one asked for (typos, settings from another version)."""
        unknown = sorted(set(self._table) - self._seen)
        if unknown:
            raise self.error(unknown[0], "unknown setting")
