"""The seed gateway (appliance/gateway/) in Debian's nginx, in front of a recording server.

Each test sends a request through the gateway and reads what the upstream
received: a JSON object posted to a sampling endpoint without a "seed" gains
exactly ``"seed":N,`` after its opening brace (N a fresh 63-bit value), and
every other request reaches the upstream byte for byte. Streamed answers are
passed on event by event. Skipped only where nginx or its JavaScript module
is not installed (the Makefile's system-deps installs both).
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cpu_bound import budget
from tests.e2e.background_server import BackgroundServer
from tests.e2e.seed_gateway import (
    GATEWAY_DIR,
    NGINX,
    Gateway,
    gateway_missing,
    nginx_config,
    seed_gateway,
)

pytestmark = pytest.mark.skipif(gateway_missing() is not None, reason=str(gateway_missing()))

SAMPLING_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
#: seed-locations.conf's client_max_body_size.
MAX_BODY = 16 * 1024 * 1024
SEEDED = re.compile(rb'\{"seed":(\d+),?')
CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi \xc3\xa9"}],"temperature":1.0}'


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(repr=False)
class Upstream:
    """What the recording server received, in order; the events a streamed answer
    waits on before its second part."""

    received: list[Received] = field(default_factory=list)
    first_event_read: threading.Event = field(default_factory=threading.Event)
    #: Whether the client had read the first event when the second was sent.
    read_before_second: list[bool] = field(default_factory=list)


def _recording_server(upstream: Upstream) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Otherwise the body waits for nginx's delayed ACK behind the headers (40 ms).
        disable_nagle_algorithm = True

        def _record(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            upstream.received.append(
                Received(self.command, self.path, dict(self.headers.items()), body)
            )
            if self.path == "/stream":
                self._stream()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def _stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(b"data: first\n\n")
            upstream.read_before_second.append(upstream.first_event_read.wait(60))
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def do_POST(self) -> None:
            self._record()

        def do_GET(self) -> None:
            self._record()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@dataclass(frozen=True)
class Setup:
    gateway: Gateway
    upstream: Upstream


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    upstream = Upstream()
    with BackgroundServer(_recording_server(upstream)) as server:
        work = tmp_path_factory.mktemp("gateway")
        with seed_gateway(work, ("127.0.0.1", server.port)) as gateway:
            yield Setup(gateway, upstream)


def _send(
    setup: Setup,
    path: str,
    body: bytes | Iterable[bytes] | None,
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> tuple[int, Received | None]:
    """The gateway's status and what the upstream received (None: nothing)."""
    before = len(setup.upstream.received)
    connection = http.client.HTTPConnection("127.0.0.1", setup.gateway.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        response.read()
    finally:
        connection.close()
    got = setup.upstream.received[before:]
    assert len(got) <= 1
    return response.status, (got[0] if got else None)


def _seed_of(sent: bytes, received: bytes) -> int:
    """The seed the gateway inserted into ``sent`` to make ``received``; asserts that
    nothing else changed."""
    match = SEEDED.match(received, len(sent) - len(sent.lstrip()))
    assert match is not None, received[:200]
    assert sent.lstrip().startswith(b"{")
    start = len(sent) - len(sent.lstrip())
    assert received[:start] + b"{" + received[match.end() :] == sent
    seed = int(match.group(1))
    assert 0 <= seed < 2**63
    return seed


@pytest.mark.parametrize("path", SAMPLING_PATHS)
def test_an_unseeded_json_object_gets_a_fresh_seed_and_nothing_else(
    setup: Setup, path: str
) -> None:
    seeds = set()
    for _ in range(3):
        status, got = _send(setup, path, CHAT, headers={"Content-Type": "application/json"})
        assert status == 200 and got is not None
        assert got.path == path
        seeds.add(_seed_of(CHAT, got.body))
        assert json.loads(got.body) == {**json.loads(CHAT), "seed": json.loads(got.body)["seed"]}
        assert got.headers["Content-Length"] == str(len(got.body))
        assert got.headers["Host"] == f"127.0.0.1:{setup.gateway.port}"
    assert len(seeds) == 3
    # The full 63 bits: a seed below 2^53 (a float's exact range) has odds 2^-10.
    assert max(seeds) >= 2**53


def test_an_empty_object_and_leading_whitespace_keep_valid_json(setup: Setup) -> None:
    for sent in (b"{}", b" \r\n\t{ }", b'\n{"messages": []}\n'):
        _, got = _send(setup, "/v1/chat/completions", sent)
        assert got is not None
        seed = _seed_of(sent, got.body)
        assert json.loads(got.body)["seed"] == seed


@pytest.mark.parametrize(
    "body",
    [
        b'{"seed":7,"messages":[]}',
        b'{"messages":[],"seed":null}',
        b'{"seed":"not a number"}',
        b"[1, 2]",
        b'"a string"',
        b"null",
        b"not json at all",
        b'{"messages": [',
        b'{"a":"\xff\xfe"}',
        b'\xef\xbb\xbf{"messages":[]}',
        b"",
    ],
    ids=repr,
)
def test_a_body_it_cannot_seed_is_forwarded_byte_for_byte(setup: Setup, body: bytes) -> None:
    status, got = _send(setup, "/v1/chat/completions", body)
    assert status == 200 and got is not None
    assert got.body == body


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/messages"),
        ("POST", "/v1/chat/completions/extra"),
        ("POST", "/tokenize"),
        ("GET", "/v1/models"),
    ],
)
def test_other_endpoints_are_forwarded_byte_for_byte(setup: Setup, method: str, path: str) -> None:
    body = None if method == "GET" else CHAT
    status, got = _send(setup, path, body, method=method)
    assert status == 200 and got is not None
    assert (got.method, got.path, got.body) == (method, path, body or b"")


def test_a_get_on_a_sampling_path_is_forwarded_without_a_body(setup: Setup) -> None:
    status, got = _send(setup, "/v1/chat/completions?x=1", None, method="GET")
    assert status == 200 and got is not None
    assert (got.method, got.path, got.body) == ("GET", "/v1/chat/completions?x=1", b"")
    assert "Content-Length" not in got.headers


def test_a_chunked_body_is_seeded(setup: Setup) -> None:
    parts = [CHAT[:10], CHAT[10:]]
    # An iterable body without a length goes out chunked.
    status, got = _send(setup, "/v1/completions", iter(parts))
    assert status == 200 and got is not None
    _seed_of(CHAT, got.body)


def test_a_body_of_the_largest_size_is_seeded_and_a_larger_one_refused(setup: Setup) -> None:
    def body_of(size: int) -> bytes:
        head, tail = b'{"prompt":"', b'"}'
        return head + b"x" * (size - len(head) - len(tail)) + tail

    status, got = _send(setup, "/v1/completions", body_of(MAX_BODY))
    assert status == 200 and got is not None
    _seed_of(body_of(MAX_BODY), got.body)
    status, got = _send(setup, "/v1/completions", body_of(MAX_BODY + 1))
    assert (status, got) == (413, None)


def test_a_body_nginx_kept_in_a_file_is_not_forwarded_unseeded(tmp_path: Path) -> None:
    """The one misconfiguration seed.js cannot work around: a buffer smaller than the
    largest body accepted. The body goes out empty (refused by any server) and the error
    log says which setting is wrong."""
    shipped = (GATEWAY_DIR / "seed-locations.conf").read_text()
    locations = tmp_path / "seed-locations.conf"
    locations.write_text(
        shipped.replace("client_body_buffer_size 16m;", "client_body_buffer_size 1k;")
    )
    upstream = Upstream()
    with (
        BackgroundServer(_recording_server(upstream)) as server,
        seed_gateway(tmp_path / "gateway", ("127.0.0.1", server.port), locations) as gateway,
    ):
        body = b'{"prompt":"' + b"x" * 4096 + b'"}'
        status, got = _send(Setup(gateway, upstream), "/v1/completions", body)
        assert status == 200 and got is not None and got.body == b""
        small = b'{"prompt":"x"}'
        _, got = _send(Setup(gateway, upstream), "/v1/completions", small)
        assert got is not None
        _seed_of(small, got.body)
    assert "client_body_buffer_size must be as large" in gateway.error_log.read_text()


def test_the_shipped_buffer_holds_the_largest_body_accepted() -> None:
    shipped = (GATEWAY_DIR / "seed-locations.conf").read_text()
    sizes = dict(
        re.findall(r"^(client_max_body_size|client_body_buffer_size) (\S+);", shipped, re.M)
    )
    assert sizes == {"client_max_body_size": "16m", "client_body_buffer_size": "16m"}


def test_a_streamed_answer_reaches_the_client_event_by_event(setup: Setup) -> None:
    setup.upstream.first_event_read.clear()
    connection = http.client.HTTPConnection("127.0.0.1", setup.gateway.port, timeout=60)
    try:
        connection.request("POST", "/stream", body=CHAT)
        response = connection.getresponse()
        assert response.readline() == b"data: first\n"
        setup.upstream.first_event_read.set()
        assert response.read() == b"\ndata: [DONE]\n\n"
    finally:
        connection.close()
    assert setup.upstream.read_before_second[-1] is True


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
BODIES = (
    st.dictionaries(st.text(), JSON_VALUES, max_size=6).map(
        lambda d: json.dumps(d, ensure_ascii=False).encode()
    )
    | st.binary(max_size=2000)
    | JSON_VALUES.map(lambda v: json.dumps(v).encode())
)


@settings(max_examples=150, deadline=None)
@given(body=BODIES)
def test_any_body_is_seeded_once_or_forwarded_unchanged(setup: Setup, body: bytes) -> None:
    before = setup.gateway.worker_cpu_s()
    status, got = _send(setup, "/v1/chat/completions", body)
    assert setup.gateway.worker_cpu_s() - before <= budget(len(body))
    assert status == 200 and got is not None
    try:
        sent = json.loads(body)
    except ValueError:
        sent = None
    if isinstance(sent, dict) and "seed" not in sent:
        seed = _seed_of(body, got.body)
        assert json.loads(got.body) == {**sent, "seed": seed}
    else:
        assert got.body == body


def test_the_debian_site_file_is_a_valid_nginx_configuration(tmp_path: Path) -> None:
    """veritap-gateway.conf with the files where DEPLOYMENT.md puts them (here under
    tmp_path instead of /etc/nginx): `nginx -t` accepts it."""
    installed = tmp_path / "veritap"
    installed.mkdir()
    for name in ("seed.js", "seed-locations.conf"):
        shutil.copy(GATEWAY_DIR / name, installed)
    site = (GATEWAY_DIR / "veritap-gateway.conf").read_text()
    conf_d = tmp_path / "veritap-gateway.conf"
    conf_d.write_text(site.replace("/etc/nginx/veritap/", f"{installed}/"))
    config = tmp_path / "nginx.conf"
    config.write_text(nginx_config(tmp_path, f"include {conf_d};"))
    assert NGINX is not None
    argv = [NGINX, "-t", "-c", str(config), "-p", str(tmp_path), "-e", str(tmp_path / "error.log")]
    checked = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
