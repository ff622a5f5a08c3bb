"""The ``logprobs`` a vLLM completions server writes, and the claim the verifier reads from
them; another model's prompt logprobs as vLLM would state them.

Shared by the engine tests of echoed (``echo``) and stated (``prompt_logprobs``) prompt
logprobs: both write the response's logprobs with vLLM's own
``OpenAIServingCompletion._create_completion_logprobs``.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import torch

from tests.verifierd.logprobs_reference import model_logits
from verifierd.engine.backend import EngineBackend
from verifierd.evidence.client_view import COMPLETIONS
from verifierd.evidence.logprobs import LogprobsClaim, claimed_logprobs


def server_logprobs(
    backend: EngineBackend, ids: list[int], entries: list[Any], shown: int
) -> dict[str, Any]:
    """The ``logprobs`` object vLLM's completions server writes for ``ids``."""
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    server: Any = types.SimpleNamespace(
        return_tokens_as_token_ids=False,
        _get_decoded_token=OpenAIServingCompletion._get_decoded_token,
    )
    written = OpenAIServingCompletion._create_completion_logprobs(
        server,
        token_ids=ids,
        top_logprobs=entries,
        num_output_top_logprobs=shown,
        tokenizer=backend._llm.get_tokenizer(),
    )
    return dict(written.model_dump())


def completions_claim(logprobs: dict[str, Any]) -> LogprobsClaim:
    """What the verifier reads from a one-choice completions body stating ``logprobs``."""
    body = {"choices": [{"index": 0, "text": "", "logprobs": logprobs}]}
    return claimed_logprobs(COMPLETIONS, json.dumps(body).encode(), False, False)[0]


def other_prompt_logprobs(
    backend: EngineBackend, model_dir: Path, prompt: tuple[int, ...], top: int
) -> list[Any]:
    """The prompt logprobs vLLM would state running ``model_dir`` (first entry None)."""
    from vllm.logprobs import Logprob
    from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens

    values = torch.log_softmax(model_logits(model_dir, prompt[:1], prompt[1:]), dim=-1)
    tokenizer = backend._llm.get_tokenizer()
    entries: list[Any] = [None]
    for row, token in zip(values, prompt[1:], strict=True):
        ranked = [int(t) for t in torch.topk(row, top).indices]
        ids = [token, *ranked]
        names = convert_ids_list_to_tokens(tokenizer, ids)
        entries.append(
            {
                t: Logprob(float(row[t]), int((row > row[t]).sum()) + 1, n)
                for t, n in zip(ids, names, strict=True)
            }
        )
    return entries
