"""The prompt vLLM's server echoes before a choice's text, split off the received text.

With ``echo`` vLLM's server puts text the model did not sample in front of each
choice's output: ``/v1/completions`` the prompt as the engine saw it (the
request's string, or the decoded prompt ids; nothing when the request asks for
``return_token_ids``), chat the last message's content when that message has the
response's role. `vllm_views.render_request` computes that text for the
captured request; the client must have received exactly it first. The rest is
the output, verified like any other; a different prefix is the prover saying it
ran another prompt (``prompt_mismatch``).
"""

from __future__ import annotations

from verifierd.evidence.claims import Finding, first_difference
from verifierd.verdicts import Reason

_SNIPPET = 24


def split_echo(received: str, echoed: str) -> str | Finding:
    """The output after ``echoed`` in ``received``, or a FAIL when ``received`` does
    not start with it."""
    if received.startswith(echoed):
        return received[len(echoed) :]
    at = first_difference(received, echoed)
    return Finding(
        Reason.PROMPT_MISMATCH,
        f"the client received a text that does not start with the {len(echoed)}-character "
        f"echo of the captured request's prompt; first difference at {at}: echo "
        f"{echoed[at : at + _SNIPPET]!r}, received {received[at : at + _SNIPPET]!r}",
    )
