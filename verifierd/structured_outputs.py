"""Structured outputs (vLLM's grammar-constrained sampling), as the verifier replays them.

vLLM 0.32's OpenAI server turns a request's ``response_format`` and
``structured_outputs`` into one ``StructuredOutputsParams``
(vllm/entrypoints/generate/base/protocol.py
``structured_outputs_from_response_format``): ``response_format`` of type
``json_object`` sets ``json_object``, ``json_schema`` sets ``json`` to its
``schema``, ``text`` changes nothing, and the result replaces the same field of
``structured_outputs``. The engine then validates it against the server's
``--structured-outputs-config`` (which picks the backend: ``auto`` tries
xgrammar and falls back to guidance or outlines), compiles the grammar once per
request, and before every sampling step sets the logits of every token the
grammar does not allow after the output so far to -inf.

`structured_output_params` is that derivation on the raw request (key order
kept: a JSON schema's property order is the order its grammar imposes);
`StructuredOutputsEngine` is the server's setting and the versions of the
grammar libraries it runs, which a commitment records; `StructuredOutput` is one
request's constraint as it travels to the engine (verifierd.engine.grammar
compiles it with vLLM's own backend code and rebuilds the mask per position).

Not replayed (the request stays ``sampler_not_reproducible``): structural tags,
and a backend other than xgrammar or guidance.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verifierd.errors import VerifierdError

#: Server settings whose grammars the verifier rebuilds.
REPLAYED_BACKENDS = ("auto", "xgrammar", "guidance")
#: The library (distribution name) behind each backend vLLM may pick.
BACKEND_LIBRARIES: Mapping[str, str] = {"xgrammar": "xgrammar", "guidance": "llguidance"}
#: Fields of vLLM's StructuredOutputsParams a request may set.
_PARAMS_FIELDS = frozenset(
    {
        "json",
        "regex",
        "choice",
        "grammar",
        "json_object",
        "structural_tag",
        "disable_any_whitespace",
        "disable_additional_properties",
        "whitespace_pattern",
    }
)
#: The fields that name a constraint (exactly one must be set).
_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StructuredOutputError(VerifierdError):
    """A request's structured output cannot be replayed (the detail says why)."""


@dataclass(frozen=True)
class StructuredOutputsEngine:
    """The prover server's structured-output setting and its grammar libraries."""

    #: ``--structured-outputs-config.backend``.
    backend: str = "auto"
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    #: (distribution, version) of every library the backend may use, sorted.
    libraries: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.backend:
            raise StructuredOutputError("the structured-output backend must be named")
        names = [name for name, _ in self.libraries]
        if names != sorted(set(names)):
            raise StructuredOutputError("structured-output libraries must be sorted and unique")

    @classmethod
    def installed(
        cls,
        backend: str = "auto",
        *,
        disable_any_whitespace: bool = False,
        disable_additional_properties: bool = False,
    ) -> StructuredOutputsEngine:
        """The setting with the versions of the grammar libraries installed here."""
        libraries = []
        for library in sorted(set(BACKEND_LIBRARIES.values())):
            try:
                libraries.append((library, importlib.metadata.version(library)))
            except importlib.metadata.PackageNotFoundError:
                continue
        return cls(backend, disable_any_whitespace, disable_additional_properties, tuple(libraries))

    def to_json(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "disable_any_whitespace": self.disable_any_whitespace,
            "disable_additional_properties": self.disable_additional_properties,
            "libraries": dict(self.libraries),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StructuredOutputsEngine:
        """Raises StructuredOutputError on a malformed value."""
        expected = {"backend", "disable_any_whitespace", "disable_additional_properties"}
        if not isinstance(data, Mapping) or set(data) != expected | {"libraries"}:
            raise StructuredOutputError(f"structured_outputs must name exactly {sorted(expected)}")
        libraries = data["libraries"]
        flags = [data["disable_any_whitespace"], data["disable_additional_properties"]]
        if (
            not isinstance(data["backend"], str)
            or not all(isinstance(f, bool) for f in flags)
            or not isinstance(libraries, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in libraries.items())
        ):
            raise StructuredOutputError("structured_outputs has a value of the wrong type")
        return cls(data["backend"], flags[0], flags[1], tuple(sorted(libraries.items())))

    def replay_problem(self, backend: str) -> str | None:
        """Why a grammar of ``backend`` (the one vLLM picked for a request) cannot be
        rebuilt here, or None: the setting must be replayed and the library must be
        installed at the committed version."""
        if self.backend not in REPLAYED_BACKENDS:
            return f"structured-output backend {self.backend!r} is not replayed"
        if self.backend == "auto" and backend != "xgrammar":
            # vLLM 0.32 compiles every grammar with the backend of a server's first
            # structured request: after a fallback it is not known which one ran.
            return f"backend 'auto' fell back to {backend!r} for this request"
        library = BACKEND_LIBRARIES.get(backend)
        if library is None:
            return f"structured-output backend {backend!r} is not replayed"
        committed = dict(self.libraries).get(library)
        try:
            installed = importlib.metadata.version(library)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if committed is None or committed != installed:
            return f"{library} {installed} is installed, the commitment names {committed}"
        return None


@dataclass(frozen=True)
class StructuredOutput:
    """One request's constraint: vLLM's StructuredOutputsParams fields as its server
    derives them from the request (a JSON object, request key order), and the
    committed setting that compiles it."""

    params_json: str
    engine: StructuredOutputsEngine

    def params(self) -> dict[str, Any]:
        value = json.loads(self.params_json)
        if not isinstance(value, dict):
            raise StructuredOutputError("structured output params are not a JSON object")
        return value

    def to_json(self) -> dict[str, object]:
        return {"params_json": self.params_json, "engine": self.engine.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StructuredOutput:
        """Raises StructuredOutputError on a malformed value."""
        if not isinstance(data, Mapping) or not isinstance(data.get("params_json"), str):
            raise StructuredOutputError("a structured output needs params_json")
        return cls(data["params_json"], StructuredOutputsEngine.from_json(data["engine"]))


def structured_output_params(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The StructuredOutputsParams fields vLLM's server derives from a chat or
    completions request (None: no constraint), or StructuredOutputError for a
    constraint that is not replayed or that vLLM would refuse."""
    given = request.get("structured_outputs")
    fields: dict[str, Any] | None = None
    if given is not None:
        if not isinstance(given, dict):
            raise StructuredOutputError("structured_outputs is not an object")
        unknown = sorted(set(given) - _PARAMS_FIELDS)
        if unknown:
            raise StructuredOutputError(f"structured_outputs names unknown fields {unknown}")
        fields = dict(given)
    response_format = request.get("response_format")
    if response_format is not None:
        if not isinstance(response_format, dict):
            raise StructuredOutputError("response_format is not an object")
        kind = response_format.get("type")
        if kind == "json_object":
            fields = {**(fields or {}), "json_object": True}
        elif kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise StructuredOutputError("response_format json_schema carries no schema")
            fields = {**(fields or {}), "json": schema}
        elif kind == "structural_tag":
            raise StructuredOutputError("structural tags are not replayed")
        elif kind != "text":
            raise StructuredOutputError(f"response_format type {kind!r} is unknown")
    if fields is None:
        return None
    constraints = [name for name in _CONSTRAINTS if fields.get(name) is not None]
    if "structural_tag" in constraints:
        raise StructuredOutputError("structural tags are not replayed")
    if len(constraints) != 1:
        raise StructuredOutputError(
            f"structured outputs with constraints {constraints}: vLLM needs exactly one"
        )
    return fields


def structured_output(
    request: Mapping[str, Any], engine: StructuredOutputsEngine | None
) -> StructuredOutput | None:
    """The request's constraint with the committed setting (None: no constraint);
    StructuredOutputError when it cannot be replayed."""
    fields = structured_output_params(request)
    if fields is None:
        return None
    if engine is None:
        raise StructuredOutputError("the commitment names no structured-output backend")
    if engine.backend not in REPLAYED_BACKENDS:
        raise StructuredOutputError(f"structured-output backend {engine.backend!r} is not replayed")
    return StructuredOutput(json.dumps(fields, ensure_ascii=False), engine)
