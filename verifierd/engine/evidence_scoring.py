"""From a choice's evidence to the token ids the engine scores (engine side).

For each `ScoreRequest` carrying `ChoiceEvidence`:

1. render the captured request with the committed engine (`vllm_views.render_request`);
   claimed prompt ids must equal that rendering (`claims.check_prompt`);
2. claimed output ids must detokenize to the received text and satisfy the
   finish rules (`claims.check_text`, `claims.check_finish`); they are then
   scored as they are;
3. without claimed ids, `search` finds them from the text, all searching
   requests of a batch sharing each engine pass; the found ids pass the same
   checks as claimed ones would.

A request with a structured output has its grammar rebuilt
(verifierd.engine.grammar) from the same request: the received text must stay
inside it before any search (else FAIL ``grammar_violation``), and so must the
claimed or found ids, end token included; a grammar the engine cannot rebuild,
or whose wait for the end of the reasoning is not where vLLM's server puts it
for the request and prompt, is UNVERIFIABLE. The scoring passes apply its
mask, so the search adopts only tokens the grammar allows.

On a server with a reasoning or tool parser (the commitment's serving flags)
the ids spell the model's raw output, not the text: claimed ids must decode to
a raw output that vLLM's parser reads as exactly the content, reasoning and
tool calls the client received; without ids the search runs on each raw output
that reads so (`verifierd.evidence.output_parsing`) and keeps the one the
sampler explains best. ``tool_calls`` is a ``stop`` (or, not streamed, a
``length``) of the engine.

With ``echo`` the prompt vLLM's server echoes is split off the received text
first (`verifierd.evidence.echo`). A completions ``echo`` with ``max_tokens: 0``
shows nothing sampled: the text must be the echo alone and nothing is scored
(the one token vLLM samples unseen is counted, its finish reason not checked);
the choice rests on its prompt's logprobs (`verifierd.engine.logprob_check`;
without ``logprobs`` in the request it is not rendered, without them in the
response, or with a one-token prompt whose one entry has no value, it is
``tokens_unavailable``).

A request whose evidence contradicts a claim gets a FAIL finding and is not
scored; one the engine cannot render or search gets an UNVERIFIABLE finding.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from verifierd.engine.grammar import (
    Grammar,
    GrammarCompiler,
    GrammarError,
    describe_violation,
    server_params,
)
from verifierd.evidence import search
from verifierd.evidence.claims import (
    Finding,
    FinishRules,
    check_finish,
    check_prompt,
    check_text,
)
from verifierd.evidence.client_view import ChoiceEvidence
from verifierd.evidence.echo import split_echo
from verifierd.evidence.vllm_views import (
    REPLACEMENT,
    ByteLevelText,
    DecodedOutput,
    RenderedRequest,
    RenderError,
    context_limit,
    decode_output,
    end_tokens,
    render_request,
)
from verifierd.structured_outputs import StructuredOutput
from verifierd.verdicts import Reason


@dataclass(frozen=True)
class Resolution:
    """The ids to score for one request, or why there are none."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    finding: Finding | None = None
    #: Margins already computed by the search's passes (None: score ``output``).
    margins: npt.NDArray[np.float64] | None = None
    restarts: int = 0
    searched: bool = False
    #: The top entries per echoed prompt token heading the choice's logprobs claim
    #: (None: no echoed prompt in it; `vllm_views.RenderedRequest.echoed_top`).
    echoed_top: int | None = None
    #: vLLM's ``prompt_logprobs`` for the request (the field's, or echo's default; None:
    #: its response states none; `verifierd.evidence.prompt_logprobs`).
    prompt_logprobs: int | None = None
    #: Output tokens the engine sampled that the client was not shown (``echo`` with
    #: ``max_tokens: 0``: one), so not scored.
    unseen: int = 0


#: Scores passes in one engine call, results in order.
PassRunner = Callable[[Sequence["PassInput"]], Sequence[search.PassResult]]


@dataclass(frozen=True)
class PassInput:
    index: int
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    score_from: int
    lookahead: bool


class RequestText:
    """The search's `TextModel` for one request."""

    def __init__(self, vocabulary: ByteLevelText, ends: frozenset[int], eos: int | None) -> None:
        self._vocabulary = vocabulary
        self._ends = ends
        self._eos = eos

    def segment(self, text: str) -> list[int]:
        return self._vocabulary.segment(text)

    def byte_tokens(self, data: bytes) -> list[int] | None:
        return self._vocabulary.byte_tokens(data)

    def token_bytes(self, token: int) -> bytes:
        return self._vocabulary.bytes_of(token)

    def text_after(self, ids: Sequence[int]) -> tuple[str, bytes]:
        return self._vocabulary.text_after(ids)

    def is_end_token(self, token: int) -> bool:
        return token in self._ends

    @property
    def end_token(self) -> int | None:
        return self._eos


class EvidenceResolver:
    """Resolves evidence requests against one loaded engine."""

    def __init__(self, llm: Any, width: int, max_model_len: int) -> None:
        self._llm = llm
        self._width = width
        self._max_model_len = max_model_len
        self._vocabularies: dict[bool, ByteLevelText] = {}
        self._grammars: GrammarCompiler | None = None

    def resolve(
        self,
        evidence: Sequence[ChoiceEvidence],
        run_passes: PassRunner,
        structured: Sequence[StructuredOutput | None] = (),
    ) -> list[Resolution]:
        """One Resolution per evidence, in order; ``structured``: each request's
        structured output (none when empty)."""
        out: list[Resolution | None] = [None] * len(evidence)
        outputs = list(evidence)
        searching: list[tuple[int, search.SearchState, _Context]] = []
        for i, ev in enumerate(evidence):
            prepared = self._prepare(ev, structured[i] if structured else None)
            if isinstance(prepared, Resolution):
                out[i] = prepared
                continue
            sampled = _without_echo(ev, prepared)
            if isinstance(sampled, Resolution):
                out[i] = sampled
                continue
            outputs[i] = sampled
            if not prepared.rendered.shows_output:
                out[i] = _prompt_only(sampled, prepared)
                continue
            if sampled.claimed_output_ids is not None:
                out[i] = self._checked(sampled, prepared, sampled.claimed_output_ids)
                continue
            states = self._initial_states(sampled, prepared)
            if isinstance(states, Resolution):
                out[i] = states
            else:
                searching.extend((i, state, ctx) for state, ctx in states)
        if searching:
            self._search(searching, run_passes)
            for i, group in itertools.groupby(searching, key=lambda s: s[0]):
                out[i] = self._found(outputs[i], [(state, ctx) for _, state, ctx in group])
        return [r for r in out if r is not None]

    def _found(
        self, ev: ChoiceEvidence, searched: Sequence[tuple[search.SearchState, _Context]]
    ) -> Resolution:
        """The searched raw output the sampler explains best (smallest sum of
        margins), checked like claimed ids; exhausted when every search was."""
        restarts = sum(state.restarts for state, _ in searched)
        done = [(state, ctx) for state, ctx in searched if not state.exhausted]
        if not done:
            state, ctx = searched[0]
            detail = (
                f"no token sequence after {state.restarts} restarts (bound {state.restart_bound})"
            )
            if len(searched) > 1:
                detail += f", nor for the {len(searched) - 1} other raw outputs"
            finding = Finding(Reason.TOKENIZATION_SEARCH_EXHAUSTED, detail)
            return Resolution(ctx.prompt, (), finding, restarts=restarts, searched=True)
        state, ctx = min(done, key=lambda found: float(np.sum(found[0].margins)))
        return self._checked(
            ev,
            ctx,
            tuple(state.output),
            margins=np.asarray(state.margins, dtype=np.float64),
            restarts=restarts,
            searched=True,
            raw=state.text,
        )

    def _prepare(
        self, ev: ChoiceEvidence, structured: StructuredOutput | None
    ) -> _Context | Resolution:
        try:
            rendered = render_request(self._llm, ev.dialect, ev.request_json, ev.serving)
        except RenderError as exc:
            return Resolution((), (), Finding(Reason.REQUEST_NOT_RENDERED, str(exc)))
        if ev.prompt_index >= len(rendered.prompts):
            detail = f"choice of prompt {ev.prompt_index}, the request has {len(rendered.prompts)}"
            return Resolution((), (), Finding(Reason.FINISH_MISMATCH, detail))
        prompt = rendered.prompts[ev.prompt_index]
        if not prompt:
            return Resolution((), (), Finding(Reason.TOKENS_UNAVAILABLE, "empty prompt"))
        mismatch = check_prompt(ev.claimed_prompt_ids, prompt)
        if mismatch is not None:
            return Resolution(prompt, (), mismatch)
        ends = end_tokens(self._llm, rendered.params)
        room = context_limit(self._llm) - len(prompt)
        length = room if rendered.max_tokens is None else min(rendered.max_tokens, room)
        finish = _engine_finish(ev, parsed=rendered.output is not None)
        if isinstance(finish, Finding):
            return Resolution(prompt, (), finish)
        rules = FinishRules(finish, ev.claimed_stop, ends, length, rendered.ignore_eos)
        grammar = self._grammar(structured, rendered.params.structured_outputs, ends)
        if isinstance(grammar, Finding):
            return Resolution(prompt, (), grammar)
        if grammar is not None and structured is not None and rendered.output is not None:
            gate = rendered.output.grammar_gate_problem(structured.reasoning_parser)
            if gate is not None:
                return Resolution(prompt, (), Finding(Reason.SAMPLER_NOT_REPRODUCIBLE, gate))
        return _Context(prompt, rendered, rules, grammar)

    def _grammar(
        self, structured: StructuredOutput | None, server: Any, ends: frozenset[int]
    ) -> Grammar | Finding | None:
        """The request's grammar, compiled as the prover's engine did; ``server`` is
        what vLLM's own request model made of the request (they must agree)."""
        if structured is None and server is None:
            return None
        try:
            if structured is None or server_params(structured) != server:
                raise GrammarError("vLLM reads another structured output from the request")
            if self._grammars is None:
                config = self._llm.llm_engine.vllm_config
                self._grammars = GrammarCompiler(config, self._llm.get_tokenizer(), self._width)
            return self._grammars.compile(structured, sorted(ends))
        except GrammarError as exc:
            return Finding(Reason.SAMPLER_NOT_REPRODUCIBLE, str(exc))

    def _text_outside_grammar(self, text: str, ctx: _Context) -> Resolution | None:
        """A FAIL when the received text leaves the grammar, whatever its tokens.

        A byte-level grammar reads bytes, so one tokenization of the text decides
        for all. Only the text before its first U+FFFD is read (its bytes are known),
        and nothing when it spells an added token (the tokenizer would read a
        special token), when the tokenizer is not byte-level, or when the request
        may go on after a stop token (ignore_eos, stop_token_ids)."""
        grammar = ctx.grammar
        tokenizer = self._llm.get_tokenizer()
        params = ctx.rendered.params
        if (
            grammar is None
            or ctx.rendered.ignore_eos
            or params.stop_token_ids
            or not ByteLevelText.supports(tokenizer)
        ):
            return None
        known = text.split(REPLACEMENT, 1)[0]
        ids = [int(i) for i in tokenizer.encode(known, add_special_tokens=False)]
        if set(ids) & set(tokenizer.get_added_vocab().values()):
            return None
        at = grammar.first_violation(ids, after_reasoning=True)
        if at is None:
            return None
        detail = "the received text leaves the request's grammar: " + describe_violation(
            tokenizer, ids, at
        )
        return Resolution(ctx.prompt, (), Finding(Reason.GRAMMAR_VIOLATION, detail))

    def _initial_states(
        self, ev: ChoiceEvidence, ctx: _Context
    ) -> list[tuple[search.SearchState, _Context]] | Resolution:
        """One search per raw output that reads as what the client received (the
        text itself without a reasoning or tool parser), and per engine finish a
        ``tool_calls`` finish may stand for."""
        texts = [ev.text]
        if ctx.rendered.output is not None:
            texts, why = ctx.rendered.output.candidates(ev.received)
            if not texts:
                detail = f"{why}, and the response claims no token ids"
                return Resolution(ctx.prompt, (), Finding(Reason.TOKENS_UNAVAILABLE, detail))
        contexts = [ctx]
        if ev.finish_reason == "tool_calls":
            contexts.append(replace(ctx, rules=replace(ctx.rules, finish_reason="length")))
        states = []
        for text, context in itertools.product(texts, contexts):
            state = self._initial_state(ev, context, text)
            if isinstance(state, Resolution):
                return state
            states.append((state, context))
        return states

    def _initial_state(
        self, ev: ChoiceEvidence, ctx: _Context, text: str
    ) -> search.SearchState | Resolution:
        outside = self._text_outside_grammar(ev.text, ctx)
        if outside is not None:
            return outside
        tokenizer = self._llm.get_tokenizer()
        if not ByteLevelText.supports(tokenizer):
            detail = "no token ids claimed and the committed tokenizer is not byte-level"
            return Resolution(ctx.prompt, (), Finding(Reason.TOKENS_UNAVAILABLE, detail))
        skip = bool(ctx.rendered.params.skip_special_tokens)
        vocabulary = self._vocabularies.get(skip)
        if vocabulary is None:
            vocabulary = self._vocabularies[skip] = ByteLevelText(tokenizer, self._width, skip)
        eos = tokenizer.eos_token_id
        # With ignore_eos nothing ends generation: an EOS is a token like any other.
        ends = frozenset() if ctx.rules.ignore_eos else ctx.rules.end_tokens
        model = RequestText(vocabulary, ends, None if eos is None else int(eos))
        claimed = ev.claimed_stop
        finish = ctx.rules.finish_reason
        if finish == "length":
            return search.initial_state(text, search.Ending.LENGTH, "", ctx.rules.length, model)
        if finish != "stop":
            detail = f"finish_reason {finish!r} is not replayed"
            return Resolution(ctx.prompt, (), Finding(Reason.TOKENS_UNAVAILABLE, detail))
        if isinstance(claimed, str):
            if claimed not in (ctx.rendered.params.stop or ()):
                detail = f"stop_reason {claimed!r} is not a stop string of the request"
                return Resolution(ctx.prompt, (), Finding(Reason.FINISH_MISMATCH, detail))
            return search.initial_state(text, search.Ending.STOP_STRING, claimed, None, model)
        return search.initial_state(text, search.Ending.END_TOKEN, "", None, model)

    def _search(
        self,
        searching: Sequence[tuple[int, search.SearchState, _Context]],
        run_passes: PassRunner,
    ) -> None:
        by_state = {id(state): (i, ctx) for i, state, ctx in searching}

        def scorer(passes: Sequence[search.ScorePass]) -> list[search.PassResult | None]:
            live = [s for _, s, _ in searching if not s.done]
            inputs, slots = [], []
            for slot, (state, p) in enumerate(zip(live, passes, strict=True)):
                i, ctx = by_state[id(state)]
                # The lookahead row needs the whole sequence inside the context.
                if len(ctx.prompt) + len(p.output) < self._max_model_len:
                    inputs.append(PassInput(i, ctx.prompt, p.output, p.score_from, True))
                    slots.append(slot)
            results: list[search.PassResult | None] = [None] * len(passes)
            for slot, result in zip(slots, run_passes(inputs), strict=True):
                results[slot] = result
            return results

        block = self._llm.llm_engine.vllm_config.cache_config.block_size
        for _, state, ctx in searching:
            state.cache_block, state.cache_offset = block, len(ctx.prompt)
        search.run_search([s for _, s, _ in searching], scorer)

    def _checked(
        self,
        ev: ChoiceEvidence,
        ctx: _Context,
        output: tuple[int, ...],
        *,
        margins: npt.NDArray[np.float64] | None = None,
        restarts: int = 0,
        searched: bool = False,
        raw: str | None = None,
    ) -> Resolution:
        """Claimed or found output ids against the received text and finish rules
        (found ids: against ``raw``, the raw output they were searched on)."""
        tokenizer = self._llm.get_tokenizer()
        decoded = decode_output(
            tokenizer, ctx.rendered.params, ctx.prompt, output, ctx.rules.end_tokens
        )
        finding = _text_finding(ev, ctx, decoded.text, output, raw)
        if finding is None:
            finding = _finish_finding(ev, ctx.rules, output, decoded)
        if finding is None and (
            min(output, default=0) < 0 or max(output, default=0) >= self._width
        ):
            finding = Finding(Reason.TOKEN_TEXT_MISMATCH, "an output id is outside the logits")
        if finding is None and len(ctx.prompt) + len(output) > self._max_model_len:
            detail = f"{len(ctx.prompt) + len(output)} tokens exceed max_model_len"
            finding = Finding(Reason.TOKENS_UNAVAILABLE, detail)
        if finding is None and ctx.grammar is not None:
            at = ctx.grammar.first_violation(output)
            if at is not None:
                detail = describe_violation(tokenizer, output, at)
                finding = Finding(Reason.GRAMMAR_VIOLATION, detail)
        return Resolution(
            ctx.prompt,
            output,
            finding,
            margins,
            restarts,
            searched,
            echoed_top=ctx.rendered.echoed_top,
            prompt_logprobs=ctx.rendered.params.prompt_logprobs,
        )


def _prompt_only(ev: ChoiceEvidence, ctx: _Context) -> Resolution:
    """A choice that shows only its echoed prompt (``max_tokens: 0``): nothing to score,
    the one token vLLM sampled unseen (its finish reason and any claimed ids are about
    it: not checked); the prompt's logprobs, when stated, are checked after scoring."""
    if ev.text:
        detail = (
            f"{len(ev.text)} characters after the echoed prompt, but max_tokens 0 "
            "shows nothing sampled"
        )
        return Resolution(ctx.prompt, (), Finding(Reason.TOKEN_TEXT_MISMATCH, detail))
    if ev.claimed_logprobs is None:
        detail = "max_tokens 0 and the response states no logprobs: nothing of the model shown"
        return Resolution(ctx.prompt, (), Finding(Reason.TOKENS_UNAVAILABLE, detail))
    if len(ctx.prompt) < 2:
        # vLLM states no value for a prompt's first token: no logprob of the model is shown.
        detail = "max_tokens 0 and a one-token prompt: nothing of the model shown"
        return Resolution(ctx.prompt, (), Finding(Reason.TOKENS_UNAVAILABLE, detail))
    return Resolution(
        ctx.prompt,
        (),
        margins=np.zeros(0),
        echoed_top=ctx.rendered.echoed_top,
        prompt_logprobs=ctx.rendered.params.prompt_logprobs,
        unseen=1,
    )


def _without_echo(ev: ChoiceEvidence, ctx: _Context) -> ChoiceEvidence | Resolution:
    """The evidence of what was sampled: the received text after the prompt vLLM's
    server echoes (`verifierd.evidence.echo`), or a FAIL when it is not there."""
    echoed = ctx.rendered.echoed(ev.prompt_index)
    if not echoed:
        return ev
    output = split_echo(ev.text, echoed)
    if isinstance(output, Finding):
        return Resolution(ctx.prompt, (), output)
    return replace(ev, text=output)


def _engine_finish(ev: ChoiceEvidence, *, parsed: bool) -> str | Finding:
    """The engine's finish reason behind the response's, or why there is none."""
    if not parsed and (ev.tool_calls or ev.reasoning):
        return Finding(
            Reason.TOKENS_UNAVAILABLE,
            "the response carries tool calls or reasoning, and the commitment names no "
            "tool or reasoning parser that would have produced them",
        )
    if ev.finish_reason != "tool_calls":
        return ev.finish_reason
    if not ev.tool_calls:
        return Finding(Reason.FINISH_MISMATCH, "'tool_calls' but the response has no tool call")
    return "stop"


def _text_finding(
    ev: ChoiceEvidence, ctx: _Context, decoded: str, output: Sequence[int], raw: str | None
) -> Finding | None:
    """Decoded ids against what the client received: the text itself, or, with a
    parser, its reading of the raw output (found ids: the raw output searched)."""
    if raw is not None:
        return check_text(raw, decoded)
    if ctx.rendered.output is None:
        return check_text(ev.text, decoded)
    differs = ctx.rendered.output.check(decoded, output, ev.received)
    return None if differs is None else Finding(Reason.TOKEN_TEXT_MISMATCH, differs)


def _finish_finding(
    ev: ChoiceEvidence, rules: FinishRules, output: Sequence[int], decoded: DecodedOutput
) -> Finding | None:
    finding = check_finish(rules, output, decoded)
    # A non-streamed response says tool_calls after a length cut as well.
    cut = ev.finish_reason == "tool_calls" and rules.finish_reason == "stop"
    if finding is not None and cut:
        return check_finish(replace(rules, finish_reason="length"), output, decoded) and finding
    return finding


@dataclass(frozen=True)
class _Context:
    prompt: tuple[int, ...]
    rendered: RenderedRequest
    rules: FinishRules
    grammar: Grammar | None = None
