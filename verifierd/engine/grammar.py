"""A request's grammar mask, rebuilt per output position with vLLM's own backend code.

vLLM 0.32 (engine side, vllm/v1/structured_output/): the request's
StructuredOutputsParams is validated against the server's StructuredOutputsConfig
(``SamplingParams._validate_structured_outputs``: picks the backend, turns a
``choice`` into an EBNF grammar for xgrammar), keyed
(``get_structured_output_key``) and compiled by the backend class
(``XgrammarBackend.compile_grammar``, with the request's ``all_stop_token_ids``:
stop tokens are allowed only where the grammar may end). Before each sampling
step the scheduler fills the request's row of the bitmask from the grammar's
state after the output so far (all ones once the grammar has terminated), and
the runner applies it to the logits (``xgr.apply_token_bitmask_inplace``); the
sampled token then advances the grammar.

`GrammarCompiler` does the same with the committed setting and library
versions; `GrammarMasks` walks a claimed output through the compiled grammar:
the row of position t is the mask after output[0:t], and a claimed token
outside its row is where the output leaves the grammar (no sampler under that
grammar could have produced it). After that position the rows allow every
token: there is no grammar state to follow, and the output already fails.

On a server with a reasoning parser (`StructuredOutput.reasoning_parser`) the
engine's StructuredOutputManager leaves the rows unconstrained and the grammar
unadvanced until a sampled token ends the reasoning (the parser's
``is_reasoning_end_streaming`` on that token, one token per step); the grammar
starts at the token after it. `ReasoningGate` does the same with vLLM's parser
class, built without the request's chat template kwargs and fed the output
only (the ``BaseThinkingReasoningParser`` family reads just the new token); an
engine-based reasoning parser (``ParserEngineReasoningAdapter``, whose end may
be implicit) is not replayed. Where vLLM's server starts the grammar at the
first token although it has a reasoning parser (a prompt that already ends the
reasoning), the evidence check (`OutputParser.grammar_gate_problem`) leaves the
request UNVERIFIABLE.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from verifierd.errors import VerifierdError
from verifierd.structured_outputs import (
    StructuredOutput,
    StructuredOutputError,
    StructuredOutputsEngine,
)


class GrammarError(VerifierdError):
    """The request's grammar cannot be rebuilt (the detail says why)."""


class GrammarCompiler:
    """Compiles structured outputs for one engine (its tokenizer and vocabulary)."""

    def __init__(self, vllm_config: Any, tokenizer: Any, vocab_size: int) -> None:
        self._vllm_config = vllm_config
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._backends: dict[tuple[str, StructuredOutputsEngine], Any] = {}

    def compile(self, structured: StructuredOutput, stop_token_ids: Sequence[int]) -> Grammar:
        """The request's grammar as the prover's engine compiled it; GrammarError when
        vLLM refuses the constraint or its backend cannot be replayed here."""
        from vllm.config import StructuredOutputsConfig
        from vllm.exceptions import VLLMError
        from vllm.sampling_params import SamplingParams
        from vllm.v1.structured_output.request import get_structured_output_key

        engine = structured.engine
        params = server_params(structured)
        try:
            config = StructuredOutputsConfig(
                backend=engine.backend,  # type: ignore[arg-type]
                disable_any_whitespace=engine.disable_any_whitespace,
                disable_additional_properties=engine.disable_additional_properties,
            )
            sampling = SamplingParams(structured_outputs=params)
            sampling._validate_structured_outputs(
                self._vllm_config.model_config, config, self._tokenizer
            )
        except (ValueError, TypeError, VLLMError, StructuredOutputError) as exc:
            raise GrammarError(f"vLLM refuses the structured output: {exc}") from exc
        backend_name = str(params._backend)
        problem = engine.replay_problem(backend_name)
        if problem is not None:
            raise GrammarError(problem)
        backend = self._backend(backend_name, engine, config)
        request_type, spec = get_structured_output_key(params)
        stops = {int(i) for i in stop_token_ids}
        try:
            backend.compile_grammar(request_type, spec, stop_token_ids=stops)
        except Exception as exc:  # vLLM fails such a request: its server answered an error
            raise GrammarError(f"the grammar does not compile: {exc!r}") from exc
        gate = None
        if structured.reasoning_parser is not None:
            gate = ReasoningGate(structured.reasoning_parser, self._tokenizer)
        return Grammar(backend, request_type, spec, stops, gate)

    def _backend(self, name: str, engine: StructuredOutputsEngine, config: Any) -> Any:
        backend = self._backends.get((name, engine))
        if backend is None:
            from vllm.v1.structured_output.backend_guidance import GuidanceBackend
            from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

            vllm_config = copy.copy(self._vllm_config)
            vllm_config.structured_outputs_config = config
            kind = XgrammarBackend if name == "xgrammar" else GuidanceBackend
            backend = kind(vllm_config, tokenizer=self._tokenizer, vocab_size=self._vocab_size)
            self._backends[(name, engine)] = backend
        return backend


class ReasoningGate:
    """The server's reasoning parser, as vLLM's engine asks it where the grammar starts."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        from vllm.parser.engine.adapters import ParserEngineReasoningAdapter
        from vllm.reasoning import ReasoningParserManager

        try:
            cls = ReasoningParserManager.get_reasoning_parser(name)
        except KeyError as exc:
            raise GrammarError(f"vLLM has no reasoning parser {name!r}") from exc
        if issubclass(cls, ParserEngineReasoningAdapter):
            raise GrammarError(f"reasoning parser {name!r} gates the grammar engine-side")
        try:
            self._parser = cls(tokenizer=tokenizer)
        except (ValueError, TypeError, KeyError) as exc:
            raise GrammarError(f"reasoning parser {name!r} cannot be built: {exc}") from exc

    def ends_reasoning(self, output_so_far: Sequence[int], token: int) -> bool:
        """Whether ``token``, sampled after ``output_so_far``, ends the reasoning."""
        return bool(self._parser.is_reasoning_end_streaming([*output_so_far, token], [token]))


class Grammar:
    """A compiled request grammar: fresh matchers for walking outputs through it."""

    def __init__(
        self,
        backend: Any,
        request_type: Any,
        spec: str,
        stops: set[int],
        gate: ReasoningGate | None = None,
    ) -> None:
        self._backend = backend
        self._request_type = request_type
        self._spec = spec
        self._stops = stops
        #: The reasoning parser the grammar waits for (None: it applies from the start).
        self.gate = gate

    def matcher(self) -> Any:
        """A StructuredOutputGrammar at the start state (the backend caches the compile)."""
        return self._backend.compile_grammar(
            self._request_type, self._spec, stop_token_ids=self._stops
        )

    def bitmask(self, rows: int) -> torch.Tensor:
        return torch.as_tensor(self._backend.allocate_token_bitmask(rows))

    def first_violation(
        self, output: Sequence[int], *, after_reasoning: bool = False
    ) -> int | None:
        """The first position of ``output`` whose token the grammar does not allow
        there, or None when the whole output follows the grammar. ``after_reasoning``:
        ``output`` is what follows the reasoning (the received content), where the
        grammar applies from its first token."""
        masks = GrammarMasks(self, after_reasoning=after_reasoning)
        ids = np.asarray(output, dtype=np.int64)
        masks.rows(0, len(ids), ids)
        return masks.violation


class GrammarMasks:
    """The grammar's mask rows along one output (`TokenMasks` of verifierd.logit_adjustments)."""

    def __init__(self, grammar: Grammar, *, after_reasoning: bool = False) -> None:
        self._grammar = grammar
        self._after_reasoning = after_reasoning
        self._matcher = grammar.matcher()
        #: Output tokens consumed (by the gate, then the matcher).
        self._position = 0
        #: Where the output left the grammar (None: it has not).
        self.violation: int | None = None
        #: The output while the reasoning lasts (None: the grammar applies).
        self._reasoning: list[int] | None = None
        self._restart_reasoning()

    def fill(self, x: torch.Tensor, start: int, output: npt.NDArray[np.int64]) -> None:
        import xgrammar as xgr

        bitmask = self.rows(start, x.shape[0], output)
        xgr.apply_token_bitmask_inplace(x, bitmask.to(x.device))

    def rows(self, start: int, n: int, output: npt.NDArray[np.int64]) -> torch.Tensor:
        """Bitmask rows (int32, xgrammar's layout) of output positions [start, start + n)."""
        if start < self._position:
            self._matcher, self._position, self.violation = self._grammar.matcher(), 0, None
            self._restart_reasoning()
        bitmask = self._grammar.bitmask(max(n, 1))
        self._advance(start, output, bitmask)
        for row in range(n):
            self._fill_row(bitmask, row)
            if start + row < len(output):
                self._accept(int(output[start + row]), bitmask[row])
        return bitmask[:n]

    def _restart_reasoning(self) -> None:
        gated = self._grammar.gate is not None and not self._after_reasoning
        self._reasoning = [] if gated else None

    def _advance(self, to: int, output: npt.NDArray[np.int64], scratch: torch.Tensor) -> None:
        while self._position < to:
            self._fill_row(scratch, 0)
            self._accept(int(output[self._position]), scratch[0])

    def _fill_row(self, bitmask: torch.Tensor, row: int) -> None:
        if self._reasoning is None and self.violation is None and not self._matcher.is_terminated():
            self._matcher.fill_bitmask(bitmask, row)
        else:
            bitmask[row].fill_(-1)

    def _accept(self, token: int, row: torch.Tensor) -> None:
        """Advance past ``token`` if its row allows it; else record the violation."""
        position = self._position
        self._position += 1
        gate = self._grammar.gate
        if self._reasoning is not None and gate is not None:
            if gate.ends_reasoning(self._reasoning, token):
                self._reasoning = None
            else:
                self._reasoning.append(token)
            return
        if self.violation is not None or self._matcher.is_terminated():
            return
        word, bit = divmod(token, 32)
        allowed = 0 <= word < row.numel() and bool((int(row[word]) >> bit) & 1)
        if not allowed or not self._matcher.accept_tokens("veritap", [token]):
            self.violation = position


def describe_violation(tokenizer: Any, output: Sequence[int], position: int) -> str:
    """A FAIL detail naming where an output leaves its grammar."""
    token = int(output[position])
    piece = json.dumps(tokenizer.decode([token]))[:40]
    return (
        f"output token {position} ({token}, {piece}) is outside the request's grammar: "
        "a sampler under that grammar cannot produce it"
    )


def server_params(structured: StructuredOutput) -> Any:
    """vLLM's StructuredOutputsParams of the constraint, as its server builds them."""
    from vllm.exceptions import VLLMError
    from vllm.sampling_params import StructuredOutputsParams

    try:
        return StructuredOutputsParams(**structured.params())
    except (ValueError, TypeError, VLLMError, StructuredOutputError) as exc:
        raise GrammarError(f"vLLM refuses the structured output: {exc}") from exc
