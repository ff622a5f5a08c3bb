"""Seed gateway benchmark: what the njs rewrite costs nginx, against plain proxying.

One nginx runs appliance/gateway/ in front of a loopback server that reads each body
and answers ``{}``. The same chat body (a JSON object without a seed, of 1 KiB,
64 KiB and 1 MiB) is posted over one keep-alive connection to ``/v1/chat/completions``
(seeded by seed.js) and to ``/v1/embeddings`` (proxied unchanged: the reference, in
the same nginx, the same run), in alternating blocks. Measured: the nginx worker's
time on a CPU (user and system, /proc/PID/schedstat) per request, which a busy shared machine
disturbs far less than wall time.

The result line gives the ratio seeded / plain at 1 MiB (the rewrite's worst case
that is accepted without raising the limit) and the seeded cost per request at 1 KiB.

    python bench/gateway_seed.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

from tests.e2e.background_server import BackgroundServer  # noqa: E402
from tests.e2e.seed_gateway import Gateway, gateway_missing, seed_gateway  # noqa: E402

SEEDED, PLAIN = "/v1/chat/completions", "/v1/embeddings"
#: Body size in bytes → requests per block.
SIZES = {1024: 1500, 64 * 1024: 500, 1024 * 1024: 100}


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without this, Nagle's algorithm holds
    # the second until nginx's delayed ACK, 40 ms per request.
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


def chat_body(size: int) -> bytes:
    """A chat request of exactly ``size`` bytes, without a seed."""
    empty = json.dumps({"model": "m", "temperature": 1.0, "messages": [{"content": ""}]})
    text = "x" * (size - len(empty))
    body = json.dumps({"model": "m", "temperature": 1.0, "messages": [{"content": text}]})
    return body.encode()


def block_cpu_s(gateway: Gateway, path: str, body: bytes, requests: int) -> float:
    """The workers' CPU seconds for ``requests`` posts of ``body`` to ``path``."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=60)
    before = gateway.worker_cpu_s()
    for _ in range(requests):
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
    spent = gateway.worker_cpu_s() - before
    connection.close()
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="alternating blocks per path")
    args = parser.parse_args()
    missing = gateway_missing()
    if missing is not None:
        print(f"result: not run ({missing})")
        return 1
    per_request: dict[tuple[int, str], float] = {}
    with (
        tempfile.TemporaryDirectory(prefix="gateway-bench-") as work,
        BackgroundServer(ThreadingHTTPServer(("127.0.0.1", 0), _Answer)) as upstream,
        seed_gateway(Path(work), ("127.0.0.1", upstream.port)) as gateway,
    ):
        for size, requests in SIZES.items():
            body = chat_body(size)
            spent = {SEEDED: 0.0, PLAIN: 0.0}
            for _ in range(args.rounds):
                for path in (SEEDED, PLAIN):
                    spent[path] += block_cpu_s(gateway, path, body, requests)
            for path, seconds in spent.items():
                per_request[size, path] = seconds / (requests * args.rounds)

    print("| body | plain proxy µs CPU/request | seeded µs CPU/request | seeded / plain |")
    print("|---|---|---|---|")
    for size in SIZES:
        plain, seeded = per_request[size, PLAIN], per_request[size, SEEDED]
        print(
            f"| {size // 1024} KiB | {plain * 1e6:.0f} | {seeded * 1e6:.0f} | "
            f"{seeded / plain:.2f}x |"
        )
    largest, smallest = max(SIZES), min(SIZES)
    ratio = per_request[largest, SEEDED] / per_request[largest, PLAIN]
    print(
        f"result: seeding a {largest // 1024} KiB body costs {ratio:.2f}x the gateway CPU "
        f"of proxying it unchanged; {per_request[smallest, SEEDED] * 1e6:.0f} µs CPU "
        f"per {smallest // 1024} KiB request"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
