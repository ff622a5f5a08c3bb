"""Client side of the live capture tests: a few API calls over one keep-alive connection.
Run: python live_client.py HOST PORT; prints the response bodies' SHA-256 as JSON."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import sys

CALLS = [
    (
        "/v1/chat/completions",
        {
            "model": "live-json",
            "messages": [{"role": "user", "content": "a"}],
            "temperature": 0.5,
            "seed": 3,
            "return_token_ids": True,
        },
    ),
    (
        "/v1/chat/completions",
        {
            "model": "live-sse",
            "messages": [{"role": "user", "content": "b"}],
            "stream": True,
            "n": 2,
            "return_token_ids": True,
        },
    ),
    ("/health", None),
    ("/v1/completions", {"model": "live-gzip", "prompt": "c", "compress": True, "max_tokens": 9}),
]


def main() -> None:
    conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=20)
    digests = {}
    for path, body in CALLS:
        if body is None:
            conn.request("GET", path)
        else:
            conn.request(
                "POST",
                path,
                body=json.dumps(body),
                headers={"Content-Type": "application/json", "Accept-Encoding": "gzip"},
            )
        response = conn.getresponse()
        data = response.read()
        if response.getheader("content-encoding") == "gzip":
            data = gzip.decompress(data)
        if body is not None:
            digests[body["model"]] = hashlib.sha256(data).hexdigest()
    conn.close()
    print(json.dumps(digests), flush=True)


if __name__ == "__main__":
    main()
