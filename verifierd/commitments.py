"""Model commitments: what a served model name is bound to, as a file.

A commitment names the exact bytes of the weights, tokenizer and config files
(SHA-256 of each), the chat template, dtype, max_model_len, the sampler profile
(engine name and version, RNG scheme), tensor-parallel size and the Token-DiFR
settings. Its id is the SHA-256 of its canonical JSON form (sorted keys, no
whitespace, UTF-8), so any change to any of these makes a different commitment.

``structured_outputs`` (the server's structured-output backend setting and the
versions of its grammar libraries, verifierd.structured_outputs) was added
later: a file without it loads with None, and its body then has no such key,
so the ids of older files stay valid; such a commitment replays no grammar.

``serving`` (the server flags that change rendering and output parsing,
verifierd.serving_flags) is written only when some flag differs from vLLM's
default, so commitments of servers started without such flags keep their ids.

The file on disk is the same JSON, indented, with the id added under
``commitment_id`` so people can read it; loading recomputes the id and refuses
a file whose stored id does not match its content.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from veritap.v1 import verifier_pb2

from verifierd.errors import VerifierdError
from verifierd.serving_flags import VLLM_DEFAULTS, ServingFlags, ServingFlagsError
from verifierd.structured_outputs import StructuredOutputError, StructuredOutputsEngine

FORMAT = "veritap.commitment/v1"
#: vLLM's --logprobs-mode choices (the first is its default).
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")

#: Files in a model directory that are documentation, not model: never committed.
_IGNORED = re.compile(r"(?i)^(readme.*|license.*|notice.*|.*\.md|\.gitattributes)$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_DTYPES = ("float32", "bfloat16", "float16")


class CommitmentError(VerifierdError):
    """A commitment file or model directory is invalid."""


@dataclass(frozen=True)
class DifrSettings:
    """Token-DiFR decision settings: score = mean(min(margin, delta_max)) <= threshold passes."""

    threshold: float
    delta_max: float
    #: Fraction of records recomputed (the others get SKIPPED), 0..1.
    sample_rate: float
    #: The largest deviation of a response's stated logprobs from the verifier's
    #: that passes (verifierd.evidence.logprobs); `verifierd calibrate` measures it.
    logprobs_tolerance: float = 0.25

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise CommitmentError(f"difr.threshold must be finite and >= 0: {self.threshold}")
        if not (math.isfinite(self.delta_max) and self.delta_max > 0):
            raise CommitmentError(f"difr.delta_max must be finite and > 0: {self.delta_max}")
        if not 0.0 <= self.sample_rate <= 1.0:
            raise CommitmentError(f"difr.sample_rate must be in [0, 1]: {self.sample_rate}")
        if not (math.isfinite(self.logprobs_tolerance) and self.logprobs_tolerance >= 0):
            raise CommitmentError(
                f"difr.logprobs_tolerance must be finite and >= 0: {self.logprobs_tolerance}"
            )

    def to_proto(self) -> verifier_pb2.DifrSettings:
        return verifier_pb2.DifrSettings(
            threshold=self.threshold,
            delta_max=self.delta_max,
            sample_rate=self.sample_rate,
            logprobs_tolerance=self.logprobs_tolerance,
        )

    @classmethod
    def from_proto(cls, msg: verifier_pb2.DifrSettings) -> DifrSettings:
        """From the message; a message without a tolerance (older) gets the default."""
        tolerance = (
            msg.logprobs_tolerance
            if msg.HasField("logprobs_tolerance")
            else DifrSettings.logprobs_tolerance
        )
        return cls(
            threshold=msg.threshold,
            delta_max=msg.delta_max,
            sample_rate=msg.sample_rate,
            logprobs_tolerance=tolerance,
        )

    def to_json(self) -> dict[str, float]:
        """The commitment's ``difr`` entry; the tolerance only when it is not the
        default, so commitments written before it existed keep their ids."""
        out = {
            "threshold": self.threshold,
            "delta_max": self.delta_max,
            "sample_rate": self.sample_rate,
        }
        if self.logprobs_tolerance != DifrSettings.logprobs_tolerance:
            out["logprobs_tolerance"] = self.logprobs_tolerance
        return out


#: Settings for a commitment nobody calibrated yet: exact float32 reproduction
#: gives margins of 0, so any systematic margin fails. `verifierd calibrate` refines them.
DEFAULT_DIFR = DifrSettings(threshold=0.05, delta_max=10.0, sample_rate=1.0)


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling values the prover's server uses for fields a request leaves out.

    vLLM's OpenAI server takes them from the model's generation_config.json
    (``--generation-config auto``, its default) and falls back to these neutral
    values (``--generation-config vllm``); the commitment records which ones apply.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    #: 0 (or -1) disables top-k, as in vLLM.
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def to_json(self) -> dict[str, float | int]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GenerationDefaults:
        floats = {
            name: float(_typed(value, (int, float)))
            for name, value in data.items()
            if name != "top_k"
        }
        return cls(top_k=_typed(data.get("top_k", 0), int), **floats)

    @classmethod
    def of_model_dir(cls, model_dir: Path) -> GenerationDefaults:
        """What vLLM 0.32 applies with ``--generation-config auto``: the non-default
        entries of the model's generation config (transformers' ``to_diff_dict``, as
        vllm.config.model.get_diff_sampling_param reads it), restricted to the
        sampling keys vLLM takes from there."""
        from transformers import AutoConfig, GenerationConfig

        try:
            config = GenerationConfig.from_pretrained(model_dir)
        except OSError:
            config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_dir))
        diff = config.to_diff_dict()
        return cls.from_json({k: diff[k] for k in cls().__dict__ if diff.get(k) is not None})


@dataclass(frozen=True)
class FileDigest:
    #: Path relative to the model directory, "/"-separated.
    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Commitment:
    served_model_names: tuple[str, ...]
    #: Sorted by path.
    files: tuple[FileDigest, ...]
    chat_template: str
    dtype: str
    max_model_len: int
    sampler_profile: str
    engine: str
    engine_version: str
    tensor_parallel_size: int
    difr: DifrSettings
    generation_defaults: GenerationDefaults = GenerationDefaults()
    #: The server's --logprobs-mode (one of LOGPROBS_MODES); written only when it is
    #: not vLLM's default, so older commitments keep their ids.
    logprobs_mode: str = "raw_logprobs"
    #: The server flags that change rendering and output parsing (absent: vLLM's defaults).
    serving: ServingFlags = VLLM_DEFAULTS
    #: None: the commitment names no structured-output backend (replays no grammar).
    structured_outputs: StructuredOutputsEngine | None = None

    def __post_init__(self) -> None:
        if not self.served_model_names or not all(self.served_model_names):
            raise CommitmentError("served_model_names must list at least one non-empty name")
        if not self.files:
            raise CommitmentError("files must not be empty")
        paths = [f.path for f in self.files]
        if paths != sorted(set(paths)):
            raise CommitmentError("files must be sorted by path and unique")
        for f in self.files:
            _check_relative(f.path)
            if not _HEX64.match(f.sha256) or f.size < 0:
                raise CommitmentError(f"files[{f.path!r}]: bad digest or size")
        if not any(f.path.endswith(".safetensors") for f in self.files):
            raise CommitmentError("no .safetensors weights among the committed files")
        if self.dtype not in _DTYPES:
            raise CommitmentError(f"dtype must be one of {', '.join(_DTYPES)}: {self.dtype!r}")
        if self.max_model_len < 1 or self.tensor_parallel_size < 1:
            raise CommitmentError("max_model_len and tensor_parallel_size must be >= 1")
        if not self.sampler_profile or not self.engine:
            raise CommitmentError("sampler_profile and engine must not be empty")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise CommitmentError(
                f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}: {self.logprobs_mode!r}"
            )

    def canonical_bytes(self) -> bytes:
        """The bytes the commitment id is the SHA-256 of."""
        return _canonical(self._body())

    @property
    def commitment_id(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    @property
    def weights_id(self) -> str:
        """Content address of the committed files alone (shared by commitments that
        differ only in settings): SHA-256 over the canonical {path: sha256} map."""
        return hashlib.sha256(_canonical({f.path: f.sha256 for f in self.files})).hexdigest()

    @property
    def weights_bytes(self) -> int:
        return sum(f.size for f in self.files if f.path.endswith(".safetensors"))

    def with_difr(self, difr: DifrSettings) -> Commitment:
        return replace(self, difr=difr)

    def to_json(self) -> str:
        """The file form: the canonical body plus its id, indented."""
        body = {"commitment_id": self.commitment_id, **self._body()}
        return json.dumps(body, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def to_proto(self) -> verifier_pb2.Commitment:
        return verifier_pb2.Commitment(
            commitment_id=self.commitment_id,
            served_model_names=list(self.served_model_names),
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            sampler_profile=self.sampler_profile,
            engine=self.engine,
            engine_version=self.engine_version,
            settings=self.difr.to_proto(),
            tensor_parallel_size=self.tensor_parallel_size,
            file_digests={f.path: f.sha256 for f in self.files},
            logprobs_mode=self.logprobs_mode,
        )

    def _body(self) -> dict[str, Any]:
        body = {
            "format": FORMAT,
            "served_model_names": list(self.served_model_names),
            "files": {f.path: {"sha256": f.sha256, "size": f.size} for f in self.files},
            "chat_template": self.chat_template,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "sampler_profile": self.sampler_profile,
            "engine": self.engine,
            "engine_version": self.engine_version,
            "tensor_parallel_size": self.tensor_parallel_size,
            "difr": self.difr.to_json(),
            "generation_defaults": self.generation_defaults.to_json(),
        }
        if self.structured_outputs is not None:
            body["structured_outputs"] = self.structured_outputs.to_json()
        if not self.serving.is_default:
            body["serving"] = self.serving.to_json()
        if self.logprobs_mode != "raw_logprobs":
            body["logprobs_mode"] = self.logprobs_mode
        return body


def _canonical(obj: object) -> bytes:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _check_relative(path: str) -> None:
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts or "\\" in path:
        raise CommitmentError(f"committed path must be relative and inside the model: {path!r}")


def sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def model_files(model_dir: Path) -> list[Path]:
    """The files of a model directory that a commitment covers: every regular file
    except documentation (README, LICENSE, *.md) and hidden ones."""
    if not model_dir.is_dir():
        raise CommitmentError(f"{model_dir}: not a directory")
    found = []
    for path in sorted(model_dir.rglob("*")):
        rel = path.relative_to(model_dir)
        if any(part.startswith(".") for part in rel.parts) or _IGNORED.match(path.name):
            continue
        if path.is_symlink() and not path.resolve().is_file():
            raise CommitmentError(f"{path}: dangling or non-file symlink")
        if path.is_file():
            found.append(path)
    return found


def digest_files(model_dir: Path, files: Iterable[Path]) -> tuple[FileDigest, ...]:
    digests = []
    for path in files:
        rel = path.relative_to(model_dir).as_posix()
        digests.append(FileDigest(path=rel, sha256=sha256_file(path), size=path.stat().st_size))
    return tuple(sorted(digests, key=lambda d: d.path))


def read_chat_template(model_dir: Path) -> str:
    """The chat template the tokenizer applies: chat_template.jinja, else the
    `chat_template` of tokenizer_config.json, else ""."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = _read_json(model_dir / "tokenizer_config.json")
    template = config.get("chat_template", "")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default", "")
    return template if isinstance(template, str) else ""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CommitmentError(f"{path}: not valid JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


def commit_model_dir(
    model_dir: Path,
    *,
    served_model_names: tuple[str, ...],
    sampler_profile: str,
    engine: str,
    engine_version: str,
    dtype: str | None = None,
    max_model_len: int | None = None,
    tensor_parallel_size: int = 1,
    difr: DifrSettings = DEFAULT_DIFR,
    generation_config: str = "auto",
    structured_outputs: StructuredOutputsEngine | None = None,
    serving: ServingFlags = VLLM_DEFAULTS,
    logprobs_mode: str = "raw_logprobs",
) -> Commitment:
    """Build the commitment for a model directory, hashing every committed file.

    dtype and max_model_len default to the model's config.json (`torch_dtype`
    or `dtype`, `max_position_embeddings`). ``generation_config`` is the prover's
    vLLM setting of that name: "auto" (sampling defaults from the model's
    generation_config.json) or "vllm" (neutral defaults). ``structured_outputs``
    defaults to vLLM's default setting ("auto") with the grammar libraries
    installed here.
    """
    if generation_config not in ("auto", "vllm"):
        raise CommitmentError(f"generation_config must be 'auto' or 'vllm': {generation_config!r}")
    defaults = GenerationDefaults()
    if generation_config == "auto":
        try:
            defaults = GenerationDefaults.of_model_dir(model_dir)
        except (TypeError, ValueError, OSError) as exc:
            raise CommitmentError(f"{model_dir}/generation_config.json: {exc}") from exc
    config = _read_json(model_dir / "config.json")
    if dtype is None:
        found = config.get("torch_dtype", config.get("dtype"))
        if not isinstance(found, str):
            raise CommitmentError(f"{model_dir}/config.json names no dtype: pass one")
        dtype = found
    if max_model_len is None:
        found_len = config.get("max_position_embeddings")
        if not isinstance(found_len, int):
            raise CommitmentError(f"{model_dir}/config.json names no max length: pass one")
        max_model_len = found_len
    return Commitment(
        served_model_names=served_model_names,
        files=digest_files(model_dir, model_files(model_dir)),
        chat_template=read_chat_template(model_dir),
        dtype=dtype,
        max_model_len=max_model_len,
        sampler_profile=sampler_profile,
        engine=engine,
        engine_version=engine_version,
        tensor_parallel_size=tensor_parallel_size,
        difr=difr,
        generation_defaults=defaults,
        structured_outputs=structured_outputs or StructuredOutputsEngine.installed(),
        serving=serving,
        logprobs_mode=logprobs_mode,
    )


def parse_commitment(text: str, *, source: str = "commitment") -> Commitment:
    """Parse the file form; a stored ``commitment_id`` must match the content."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommitmentError(f"{source}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CommitmentError(f"{source}: expected a JSON object")
    stored_id = data.pop("commitment_id", None)
    if data.get("format") != FORMAT:
        raise CommitmentError(f"{source}: format must be {FORMAT!r}")
    try:
        commitment = _from_body(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CommitmentError(f"{source}: malformed: {exc!r}") from exc
    except CommitmentError as exc:
        raise CommitmentError(f"{source}: {exc}") from exc
    if stored_id is not None and stored_id != commitment.commitment_id:
        raise CommitmentError(
            f"{source}: commitment_id {stored_id} does not match its content "
            f"({commitment.commitment_id}); the file was edited"
        )
    return commitment


def _from_body(data: Mapping[str, Any]) -> Commitment:
    expected = {
        "format",
        "served_model_names",
        "files",
        "chat_template",
        "dtype",
        "max_model_len",
        "sampler_profile",
        "engine",
        "engine_version",
        "tensor_parallel_size",
        "difr",
        "generation_defaults",
    }
    optional = {"structured_outputs", "serving", "logprobs_mode"}
    if set(data) - optional != expected:
        extra, missing = set(data) - expected - optional, expected - set(data)
        raise CommitmentError(f"unexpected keys {sorted(extra)}, missing {sorted(missing)}")
    files = tuple(
        FileDigest(path=path, sha256=_typed(v["sha256"], str), size=_typed(v["size"], int))
        for path, v in sorted(data["files"].items())
    )
    difr = data["difr"]
    defaults = data["generation_defaults"]
    if not isinstance(defaults, dict) or set(defaults) != set(GenerationDefaults().__dict__):
        raise CommitmentError("generation_defaults must name exactly the vLLM default keys")
    return Commitment(
        served_model_names=tuple(_typed(n, str) for n in data["served_model_names"]),
        files=files,
        chat_template=_typed(data["chat_template"], str),
        dtype=_typed(data["dtype"], str),
        max_model_len=_typed(data["max_model_len"], int),
        sampler_profile=_typed(data["sampler_profile"], str),
        engine=_typed(data["engine"], str),
        engine_version=_typed(data["engine_version"], str),
        tensor_parallel_size=_typed(data["tensor_parallel_size"], int),
        difr=DifrSettings(
            threshold=float(_typed(difr["threshold"], (int, float))),
            delta_max=float(_typed(difr["delta_max"], (int, float))),
            sample_rate=float(_typed(difr["sample_rate"], (int, float))),
            logprobs_tolerance=float(
                _typed(
                    difr.get("logprobs_tolerance", DifrSettings.logprobs_tolerance), (int, float)
                )
            ),
        ),
        logprobs_mode=_typed(data.get("logprobs_mode", "raw_logprobs"), str),
        generation_defaults=GenerationDefaults.from_json(defaults),
        structured_outputs=_structured_outputs(data.get("structured_outputs")),
        serving=_serving(data.get("serving")),
    )


def _serving(data: Any) -> ServingFlags:
    if data is None:
        return VLLM_DEFAULTS
    try:
        return ServingFlags.from_json(data)
    except ServingFlagsError as exc:
        raise CommitmentError(str(exc)) from exc


def _structured_outputs(data: Any) -> StructuredOutputsEngine | None:
    if data is None:
        return None
    try:
        return StructuredOutputsEngine.from_json(data)
    except StructuredOutputError as exc:
        raise CommitmentError(str(exc)) from exc


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"unexpected value {value!r}")
    return value


def load_commitment(path: Path) -> Commitment:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommitmentError(f"{path}: cannot read: {exc}") from exc
    return parse_commitment(text, source=str(path))


def write_commitment(commitment: Commitment, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(commitment.to_json(), encoding="utf-8")
    tmp.replace(path)


@dataclass(frozen=True)
class CommitmentRegistry:
    """The commitments this verifier knows, by id and by served model name."""

    by_id: Mapping[str, Commitment]
    by_model: Mapping[str, Commitment]

    @classmethod
    def of(cls, commitments: Iterable[Commitment]) -> CommitmentRegistry:
        by_id: dict[str, Commitment] = {}
        by_model: dict[str, Commitment] = {}
        for c in commitments:
            by_id[c.commitment_id] = c
            for name in c.served_model_names:
                other = by_model.get(name)
                if other is not None and other.commitment_id != c.commitment_id:
                    raise CommitmentError(
                        f"model name {name!r} is served by two commitments: "
                        f"{other.commitment_id[:12]} and {c.commitment_id[:12]}"
                    )
                by_model[name] = c
        return cls(by_id=by_id, by_model=by_model)

    @classmethod
    def from_dir(cls, directory: Path) -> CommitmentRegistry:
        """Every ``*.json`` in ``directory`` (none when it does not exist)."""
        paths = sorted(directory.glob("*.json")) if directory.is_dir() else []
        return cls.of(load_commitment(p) for p in paths)
