"""The evidence a verdict is bound to: what the client sent and what it received.

The prover is the party under suspicion, so what it says about itself is a
*claim*, never evidence:

- The **prompt** is what the captured request body renders to under the
  commitment, with vLLM's own request rendering (`rendering`): the chat
  template, generation prompt, content parts, ``add_special_tokens``,
  ``chat_template_kwargs`` and ``continue_final_message`` exactly as the
  committed vLLM version's server applies them.
- The **output** is the text the client received (``Choice.text``, assembled
  from the captured response as the OpenAI SDK assembles it).
- Token ids in a response (``prompt_token_ids``, ``token_ids``) are claims.
  They are used only when the prompt ids equal the verifier's own rendering and
  the output ids detokenize, exactly as vLLM's detokenizer turns them into the
  response text for this request, to the text received (`claims`).
- Without ids (the normal case: real clients do not ask for them) the ids are
  *found*: `search` looks for the token sequence the committed sampler would
  have produced that decodes to the received text.
- ``finish_reason``, ``stop_reason`` and ``usage`` are claims checked against
  the request (`claims.check_finish`).

`client_view` (no torch, no vLLM) cuts a record into per-choice evidence in the
daemon; the rest runs in the engine process, next to the committed tokenizer.
"""
