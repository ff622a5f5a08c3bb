"""Record and replay NVML call sequences, so the meter's NVML code runs without a GPU.

The samplers never call pynvml directly: they call a small API object (`GpmApi`,
`UtilizationApi`) whose real implementation wraps pynvml. `CallRecorder` captures what a real
API object answered, call by call, as JSON lines; `CallScript` plays such a sequence back and
fails loudly when the code under test asks for a different call than the one recorded next.

One line per call: {"call": NAME, "args": {...}, "result": VALUE} or, for a failed call,
{"call": NAME, "args": {...}, "error": {"code": NVML_RETURN, "message": TEXT}}.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from verifierd.meter.errors import NvmlCallError, ReplayMismatchError

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]
Args = Mapping[str, int | str]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One NVML call as it happened: its name, arguments, and result or error."""

    call: str
    args: Args
    result: JsonValue = None
    error_code: int | None = None
    error_message: str = ""

    def to_json(self) -> str:
        line: dict[str, JsonValue] = {"call": self.call, "args": dict(self.args)}
        if self.error_code is None:
            line["result"] = self.result
        else:
            line["error"] = {"code": self.error_code, "message": self.error_message}
        return json.dumps(line, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RecordedCall:
        line = json.loads(text)
        if not isinstance(line, dict) or not isinstance(line.get("call"), str):
            raise ReplayMismatchError(f"not a recorded call: {text!r}")
        raw_args = line.get("args", {})
        if not isinstance(raw_args, dict):
            raise ReplayMismatchError(f"args must be an object: {text!r}")
        args: dict[str, int | str] = {}
        for key, value in raw_args.items():
            if not isinstance(value, int | str):
                raise ReplayMismatchError(f"argument {key} must be an int or a string: {text!r}")
            args[key] = value
        error = line.get("error")
        if error is not None:
            if not isinstance(error, dict) or not isinstance(error.get("code"), int):
                raise ReplayMismatchError(f"error must carry an integer code: {text!r}")
            return cls(line["call"], args, None, error["code"], str(error.get("message", "")))
        return cls(line["call"], args, line.get("result"))


class CallRecorder:
    """Collects the calls a real API object made; `dump()` writes them as JSON lines."""

    def __init__(self) -> None:
        self.calls: list[RecordedCall] = []

    def call(
        self, name: str, args: Args, fn: Callable[[], T], encode: Callable[[T], JsonValue]
    ) -> T:
        """Run `fn`, record its result (through `encode`) or its NvmlCallError, pass it on."""
        try:
            result = fn()
        except NvmlCallError as exc:
            self.calls.append(RecordedCall(name, dict(args), None, exc.code, str(exc)))
            raise
        self.calls.append(RecordedCall(name, dict(args), encode(result)))
        return result

    def lines(self) -> list[str]:
        return [c.to_json() for c in self.calls]

    def dump(self, path: Path) -> None:
        path.write_text("".join(line + "\n" for line in self.lines()))


class CallScript:
    """Plays back recorded calls in order."""

    def __init__(self, calls: Iterable[RecordedCall]) -> None:
        self._calls = list(calls)
        self._next = 0

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> CallScript:
        return cls(RecordedCall.from_json(line) for line in lines if line.strip())

    @classmethod
    def load(cls, path: Path) -> CallScript:
        return cls.from_lines(path.read_text().splitlines())

    @property
    def remaining(self) -> int:
        return len(self._calls) - self._next

    def expect(self, name: str, args: Args) -> JsonValue:
        """The recorded result of the next call, which must be `name(args)`.

        Raises the recorded NvmlCallError for a call that failed when it was recorded.
        """
        if self._next >= len(self._calls):
            raise ReplayMismatchError(f"{name}({dict(args)}) called after the recording ended")
        recorded = self._calls[self._next]
        if recorded.call != name or dict(recorded.args) != dict(args):
            raise ReplayMismatchError(
                f"call {self._next}: expected {recorded.call}({dict(recorded.args)}), "
                f"got {name}({dict(args)})"
            )
        self._next += 1
        if recorded.error_code is not None:
            raise NvmlCallError(recorded.error_code, recorded.error_message)
        return recorded.result


def expect_int(value: JsonValue, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReplayMismatchError(f"{what}: expected an integer, recorded {value!r}")
    return value


def expect_bool(value: JsonValue, what: str) -> bool:
    if not isinstance(value, bool):
        raise ReplayMismatchError(f"{what}: expected true or false, recorded {value!r}")
    return value


def expect_number(value: JsonValue, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ReplayMismatchError(f"{what}: expected a number, recorded {value!r}")
    return float(value)


def expect_list(value: JsonValue, what: str) -> list[JsonValue]:
    if not isinstance(value, list):
        raise ReplayMismatchError(f"{what}: expected a list, recorded {value!r}")
    return value
