"""The config schema mechanism: every problem at once, under its TOML path; finite numbers;
no coercion; paths from the file's folder; cross-field findings under their keys."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Annotated, Self

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass
from veritap.config_schema import (
    SECTION,
    ConfigError,
    ConfigFile,
    ConfigPath,
    Flag,
    Integer,
    LogLevel,
    MetricsListen,
    Number,
    Text,
    json_schema,
    read_toml,
    reject,
    toml_path,
    validate_document,
)


@dataclass(frozen=True, config=SECTION)
class _Link:
    address: Text
    window: Annotated[Integer, Field(ge=1)] = 16
    cert: ConfigFile = ""
    key: ConfigFile = ""

    @model_validator(mode="after")
    def _pair(self) -> Self:
        if bool(self.cert) != bool(self.key):
            reject(self, [("key" if self.cert else "cert", "set cert and key both or neither")])
        return self


@dataclass(frozen=True, config=SECTION)
class _Section:
    timeout_s: Annotated[Number, Field(ge=0.001)] = 1.0
    on: Flag = True
    path: ConfigPath = Path("/var/lib/x")
    level: LogLevel = LogLevel.INFO
    listen: MetricsListen = "127.0.0.1:9400"


@dataclass(frozen=True, config=SECTION)
class _Document:
    main: _Section = _Section()
    links: tuple[_Link, ...] = ()


def _validate(document: dict[str, object]) -> _Document:
    return validate_document(_Document, document, base_dir=Path("/etc/x"))


def _problems(document: dict[str, object]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        _validate(document)
    return caught.value.problems


def test_an_empty_document_is_the_defaults() -> None:
    assert _validate({}) == _Document()


def test_every_problem_is_reported_at_once_with_its_path() -> None:
    problems = _problems(
        {
            "main": {"timeout_s": "soon", "on": 1, "typo": 2, "level": "loud"},
            "links": [
                {"address": "a:1", "window": 0},
                {"window": 2},
                {"address": "b", "cert": "c"},
            ],
            "extra": {},
        }
    )
    assert problems == (
        "main.timeout_s: expected a number, got 'soon'",
        "main.on: expected true or false, got 1",
        "main.level: expected 'debug', 'info', 'warning' or 'error', got 'loud'",
        "main.typo: unknown key",
        "links[0].window: must be >= 1, got 0",
        "links[1].address: required",
        "links[2].key: set cert and key both or neither",
        "extra: unknown key",
    )


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused(value: float) -> None:
    assert _problems({"main": {"timeout_s": value}}) == (
        f"main.timeout_s: expected a finite number, got {value!r}",
    )


def test_integers_are_numbers_but_nothing_else_is_coerced() -> None:
    assert _validate({"main": {"timeout_s": 2}}).main.timeout_s == 2.0
    assert _problems({"links": [{"address": 5, "window": "3"}]}) == (
        "links[0].address: expected a string, got 5",
        "links[0].window: expected an integer, got '3'",
    )
    assert _problems({"main": 3}) == ("main: expected a table, got 3",)
    assert _problems({"links": {"address": "a"}}) == ("links: expected an array, got a table",)


def test_paths_are_taken_from_the_files_folder() -> None:
    document = _validate(
        {"main": {"path": "state"}, "links": [{"address": "a", "cert": "c.pem", "key": "/k"}]}
    )
    assert document.main.path == Path("/etc/x/state")
    assert (document.links[0].cert, document.links[0].key) == ("/etc/x/c.pem", "/k")
    assert _problems({"main": {"path": ""}}) == ("main.path: expected a non-empty string, got ''",)


def test_metrics_listen_is_checked_and_may_be_off() -> None:
    assert _validate({"main": {"listen": ""}}).main.listen == ""
    (problem,) = _problems({"main": {"listen": "9400"}})
    assert problem.startswith("main.listen: metrics address '9400'")


def test_log_levels_are_the_logging_modules() -> None:
    assert [level.number for level in LogLevel] == [
        logging.DEBUG,
        logging.INFO,
        logging.WARNING,
        logging.ERROR,
    ]


def test_toml_paths() -> None:
    assert toml_path(("collectors", 0, "window")) == "collectors[0].window"
    assert toml_path(("provers", "hiding", "reasons")) == "provers.hiding.reasons"
    assert toml_path(()) == ""


def test_read_toml_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_toml(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[main\n")
    with pytest.raises(ConfigError, match=r"bad\.toml.*not valid TOML"):
        read_toml(bad)


def test_the_json_schema_carries_the_constraints() -> None:
    schema = json_schema(_Document, title="test")
    assert schema["title"] == "test" and schema["additionalProperties"] is False
    section = schema["$defs"]["_Section"]
    assert section["additionalProperties"] is False
    assert section["properties"]["timeout_s"]["minimum"] == 0.001
    assert schema["$defs"]["LogLevel"]["enum"] == ["debug", "info", "warning", "error"]


_SCALARS = st.one_of(
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
)
_KEYS = st.sampled_from(["main", "links", "timeout_s", "on", "path", "address", "window", "x"])
_DOCUMENTS = st.recursive(
    st.dictionaries(_KEYS, _SCALARS, max_size=4),
    lambda inner: st.dictionaries(_KEYS, st.one_of(_SCALARS, inner, st.lists(inner, max_size=2))),
    max_leaves=10,
)


@given(_DOCUMENTS)
def test_any_document_validates_or_names_each_problems_key(document: dict[str, object]) -> None:
    try:
        validated = _validate(document)
    except ConfigError as exc:
        assert exc.problems and all(": " in problem for problem in exc.problems)
        assert str(exc) == "\n".join(exc.problems)
    else:
        assert math.isfinite(validated.main.timeout_s)
