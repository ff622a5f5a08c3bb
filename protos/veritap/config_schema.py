"""One schema mechanism for the daemons' TOML files: typed sections, every error at once.

Each daemon describes its file as frozen pydantic dataclasses (one per TOML table) whose
fields carry their type, default, range and description; `validate_document` checks a
parsed document against them and raises one `ConfigError` that lists every problem, each
under its TOML path (``capture.snaplen``, ``collectors[1].window``). The same classes give
the JSON Schema editors use (`json_schema`, exported by ``make config-schema``).

Why pydantic: it reports all errors of a document in one pass with their locations, where
msgspec stops at the first one; it validates dataclasses, so the sections stay ordinary
frozen dataclasses that the rest of the code builds, compares and `replace`s; it turns the
same field constraints into JSON Schema; and verifierd already depends on it through vLLM.

The rules every section shares (`SECTION`): unknown keys are errors, numbers must be finite
(``nan`` and ``inf`` are refused), and scalars are not coerced: a string is not an integer,
``true`` is not a number. Integers are accepted where a number is expected.
"""

from __future__ import annotations

import enum
import logging
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, TypeVar

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from veritap.metrics_http import MetricsAddressError, parse_listen

#: The validation settings of every config section.
SECTION: Final = ConfigDict(extra="forbid", allow_inf_nan=False)

#: JSON Schema dialect of the exported schemas.
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_BASE_DIR = "base_dir"
T = TypeVar("T")

Integer = Annotated[int, Strict()]
Number = Annotated[float, Strict()]
Text = Annotated[str, Strict()]
NonEmptyText = Annotated[str, Strict(), Field(min_length=1)]
Flag = Annotated[bool, Strict()]


class ConfigError(ValueError):
    """A configuration file cannot be read or is invalid; `problems` lists every finding,
    each starting with the TOML path of its key (the message is one problem per line)."""

    def __init__(self, problems: str | tuple[str, ...]) -> None:
        self.problems = (problems,) if isinstance(problems, str) else problems
        super().__init__("\n".join(self.problems))


def problem(message: str) -> PydanticCustomError:
    """The error a section's cross-field check raises; its message is shown as written."""
    return PydanticCustomError("config", "{message}", {"message": message})


def reject(section: object, findings: Sequence[tuple[str, str]]) -> None:
    """Raise the findings of a section's cross-field checks, each ``(key, message)``, all at
    once and each under its key's path: "" for the section itself, dots for a key of a table
    inside it (``hiding.window_s``). Nothing when there are none."""
    if findings:
        details = [
            InitErrorDetails(
                type=problem(message),
                loc=tuple(key.split(".")) if key else (),
                input=_value_at(section, key),
            )
            for key, message in findings
        ]
        raise ValidationError.from_exception_data(type(section).__name__, details)


def _value_at(section: object, key: str) -> object:
    value = section
    for name in key.split(".") if key else ():
        value = getattr(value, name, None)
    return value


class LogLevel(enum.StrEnum):
    """`[log] level`: the least severe messages a daemon logs."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def number(self) -> int:
        """The `logging` level."""
        return logging.getLevelNamesMapping()[self.name]


def _metrics_listen(listen: str) -> str:
    if listen:
        try:
            parse_listen(listen)
        except MetricsAddressError as exc:
            raise problem(f"{exc} (empty: no endpoint)") from exc
    return listen


#: Where Prometheus /metrics is served (host:port, [v6]:port; "": none).
MetricsListen = Annotated[Text, AfterValidator(_metrics_listen)]


def _path_text(value: object) -> object:
    """TOML gives paths as strings: refuse other types and the empty string (which would
    name the current folder); a Path built by code passes as it is."""
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value:
        raise problem(f"expected a non-empty string, got {_shown(value)}")
    return value


def _relative_to_file(path: Path, info: ValidationInfo) -> Path:
    base = info.context.get(_BASE_DIR) if isinstance(info.context, dict) else None
    path = path.expanduser()
    return path if base is None or path.is_absolute() else base / path


def _text_relative_to_file(text: str, info: ValidationInfo) -> str:
    return str(_relative_to_file(Path(text), info)) if text else ""


#: A path; relative paths are taken from the config file's folder.
ConfigPath = Annotated[Path, BeforeValidator(_path_text), AfterValidator(_relative_to_file)]
#: An optional file as a string: "" for none, else resolved like `ConfigPath`.
ConfigFile = Annotated[Text, AfterValidator(_text_relative_to_file)]


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(schema: type[Any]) -> TypeAdapter[Any]:
    """The validator of `schema`, built once (building one costs milliseconds)."""
    if schema not in _ADAPTERS:
        _ADAPTERS[schema] = TypeAdapter(schema)
    return _ADAPTERS[schema]


def validate_document(schema: type[T], document: Mapping[str, object], *, base_dir: Path) -> T:
    """`document` (a parsed TOML file) as `schema`; ConfigError with every problem otherwise.

    Relative paths in it are taken from `base_dir`, the config file's folder.
    """
    try:
        value: T = _adapter(schema).validate_python(document, context={_BASE_DIR: base_dir})
    except ValidationError as exc:
        errors = _without_echoes(exc.errors())
        raise ConfigError(tuple(describe_error(error) for error in errors)) from None
    return value


def _without_echoes(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """Leave out an array's "too short" error when its items failed: pydantic counts only
    the valid items, so the array is reported short because of the bad item already named."""
    failed_items = {tuple(error["loc"][:-1]) for error in errors if error["loc"]}
    return [
        error
        for error in errors
        if not (error["type"] == "too_short" and tuple(error["loc"]) in failed_items)
    ]


def read_toml(path: Path) -> dict[str, Any]:
    """The parsed TOML file, or ConfigError saying why it cannot be read."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"{str(path)!r}: cannot read: {exc.strerror}") from exc
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{str(path)!r}: not valid TOML: {exc}") from exc


def dump_document(schema: type[Any], value: object) -> dict[str, Any]:
    """`value` (an instance of `schema`) as plain data, every default filled in."""
    data: dict[str, Any] = _adapter(schema).dump_python(value, mode="json")
    return data


def json_schema(schema: type[Any], *, title: str) -> dict[str, Any]:
    """The JSON Schema of a config file described by `schema`."""
    generated: dict[str, Any] = _adapter(schema).json_schema()
    return {"$schema": JSON_SCHEMA_DIALECT, **generated, "title": title}


def toml_path(location: tuple[int | str, ...]) -> str:
    """``("collectors", 0, "window")`` as ``collectors[0].window``."""
    text = ""
    for part in location:
        if part == "[key]":  # pydantic's marker for a table's key (the key is already named)
            continue
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


_MESSAGES: Final = {
    "extra_forbidden": "unknown key",
    "unexpected_keyword_argument": "unknown key",
    "missing": "required",
    "missing_argument": "required",
    "dataclass_type": "expected a table, got {input}",
    "dataclass_exact_type": "expected a table, got {input}",
    "dict_type": "expected a table, got {input}",
    "tuple_type": "expected an array, got {input}",
    "list_type": "expected an array, got {input}",
    "int_type": "expected an integer, got {input}",
    "float_type": "expected a number, got {input}",
    "finite_number": "expected a finite number, got {input}",
    "string_type": "expected a string, got {input}",
    "bool_type": "expected true or false, got {input}",
    "string_too_short": "expected a non-empty string",
    "too_short": "expected at least {min_length} item(s)",
    "greater_than": "must be > {gt}, got {input}",
    "greater_than_equal": "must be >= {ge}, got {input}",
    "less_than": "must be < {lt}, got {input}",
    "less_than_equal": "must be <= {le}, got {input}",
    "literal_error": "expected {expected}, got {input}",
    "enum": "expected {expected}, got {input}",
}


def describe_error(error: ErrorDetails) -> str:
    """One validation error as ``toml.path: what is wrong``."""
    where = toml_path(tuple(error["loc"]))
    context = error.get("ctx") or {}
    template = _MESSAGES.get(error["type"])
    if template is None:
        message = error["msg"]
    else:
        message = template.format(input=_shown(error.get("input")), **context)
    return f"{where}: {message}" if where else message


def _shown(value: object) -> str:
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    return repr(value)
