"""A tiny OpenAI-style server (aiohttp) answering with the canned vLLM-shaped responses of
tests/openai_traffic.py, for the live capture tests. Run: python openai_server.py HOST PORT."""

from __future__ import annotations

import json
import sys

from aiohttp import web

from tests.openai_traffic import Call, words


def call_for(path: str, body: dict[str, object]) -> Call:
    key = "messages" if path.endswith("chat/completions") else "prompt"
    n = int(str(body.get("n", 1)))
    params = {k: v for k, v in body.items() if k not in ("model", key)}
    return Call(
        path,
        str(body.get("model", "")),
        body.get(key),
        params,
        [words(8 + 3 * i, seed=i) for i in range(n)],
        prompt_token_ids=(1, 2, 3, 4),
        response_id="chatcmpl-live",
    )


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    call = call_for(request.path, body)
    if not call.stream:
        response = web.Response(body=call.response_json(), content_type="application/json")
        if body.get("compress"):
            response.enable_compression()
        return response
    stream = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
    await stream.prepare(request)
    for event in call.sse_events():
        await stream.write(event)
    await stream.write_eof()
    return stream


async def health(_request: web.Request) -> web.Response:
    return web.Response(text=json.dumps({"ok": True}))


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    print("serving", flush=True)
    web.run_app(app, host=host, port=port, print=None, handle_signals=True)


if __name__ == "__main__":
    main()
