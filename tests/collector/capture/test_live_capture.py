"""Live capture with `collector run`: loopback, and a mirror port between two namespaces.

Both need root (AF_PACKET, network namespaces, tc) and skip without it. The
traffic is real: an aiohttp server and an http.client client, in processes
of their own; the collector is a real `collector run` stopped with SIGTERM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from veritap.signing import Signer

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'protos'}"}

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="live capture needs root (AF_PACKET, netns, tc)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_line(proc: subprocess.Popen[str], needle: str, stream: str, timeout: float) -> None:
    pipe = proc.stderr if stream == "stderr" else proc.stdout
    assert pipe is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = pipe.readline()
        if needle in line:
            return
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"{needle!r} never appeared ({proc.args})")


def wait_for_port(prefix: list[str], host: str, port: int, timeout: float = 20) -> None:
    probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=1).close()"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = subprocess.run(
            [*prefix, sys.executable, "-c", probe], check=False, capture_output=True, timeout=30
        )
        if done.returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {host}:{port}")


def start_collector(
    tmp_path: Path, interface: str, port: int, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    key = tmp_path / "collector.key"
    if not key.exists():
        signer = Signer.generate("live.test/collector")
        signer.save(key)
        (tmp_path / "collector.pub").write_text(signer.verifier().key_string() + "\n")
    config = tmp_path / "collector.toml"
    config.write_text(
        f'[collector]\norigin = "live.test/collector"\n'
        f'[capture]\ninterface = "{interface}"\nfilter = "tcp port {port}"\n'
        # Loopback and tc mirror egress copies carry checksums offload left unfilled.
        'checksums = "ignore"\n'
        f"server_ports = [{port}]\nring_blocks = 8\nstats_interval_s = 1.0\n"
        f'[log]\npath = "log"\nkey = "collector.key"\nbatch_delay_s = 0.01\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector.cli", "run", "--config", str(config)],
        cwd=ROOT,
        env=env or ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_line(proc, "capturing on", "stderr", 30)
    return proc


def stop_collector(proc: subprocess.Popen[str]) -> str:
    time.sleep(0.5)  # let the last packets reach the ring
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "records" in out
    return out


def export(log: Path) -> dict[str, dict[str, object]]:
    """The exported records by model (the last one of each model)."""
    return {str(r["model"]): r for r in export_list(log)}


def export_list(log: Path) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "collector.cli", "log", "export", str(log)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def run_client(prefix: list[str], host: str, port: int) -> dict[str, str]:
    done = subprocess.run(
        [*prefix, sys.executable, str(HERE / "live_client.py"), host, str(port)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    digests: dict[str, str] = json.loads(done.stdout)
    return digests


def check_records(records: dict[str, dict[str, object]], digests: dict[str, str]) -> None:
    assert sorted(records) == sorted(digests) == ["live-gzip", "live-json", "live-sse"]
    for model, digest in digests.items():
        rec = records[model]
        assert rec["quality"] == "complete", rec["quality_reason"]
        assert rec["response_body_sha256"] == digest
        assert rec["http_status"] == 200
    sse = records["live-sse"]
    assert [len(c["token_ids"]) for c in sse["choices"]] == [8, 11]  # type: ignore[index, union-attr]
    assert sse["prompt_token_ids"] == [1, 2, 3, 4]
    assert sse["sse_events"] == 2 + 8 + 11 + 1
    assert records["live-json"]["sampling"] == {
        "temperature": 0.5,
        "seed": 3,
        "return_token_ids": True,
        "model": "live-json",
    }


def test_loopback_capture_with_collector_run(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(HERE / "openai_server.py"), "127.0.0.1", str(port)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    try:
        wait_for_port([], "127.0.0.1", port)
        env = {**ENV, "NOTIFY_SOCKET": str(tmp_path / "notify")}
        collector = start_collector(tmp_path, "lo", port, env)
        try:
            assert b"READY=1" in notify.recv(4096)
            digests = run_client([], "127.0.0.1", port)
        finally:
            summary = stop_collector(collector)
    finally:
        notify.close()
        server.terminate()
        server.wait(timeout=30)
    check_records(export(tmp_path / "log"), digests)
    assert "kernel 0" in summary


def test_kill_9_leaves_a_valid_log_and_run_resumes(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(HERE / "openai_server.py"), "127.0.0.1", str(port)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port([], "127.0.0.1", port)
        collector = start_collector(tmp_path, "lo", port)
        try:
            digests = run_client([], "127.0.0.1", port)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(export_list(tmp_path / "log")) < len(digests):
                time.sleep(0.2)
        finally:
            collector.kill()
            collector.communicate(timeout=30)
        assert collector.returncode == -signal.SIGKILL
        verify = [sys.executable, "-m", "collector.cli", "log", "verify", str(tmp_path / "log")]
        verify += ["--pubkey", str(tmp_path / "collector.pub")]
        subprocess.run(verify, cwd=ROOT, env=ENV, check=True, capture_output=True, timeout=60)
        check_records(export(tmp_path / "log"), digests)
        collector = start_collector(tmp_path, "lo", port)
        try:
            run_client([], "127.0.0.1", port)
        finally:
            stop_collector(collector)
    finally:
        server.terminate()
        server.wait(timeout=30)
    records = export_list(tmp_path / "log")
    assert len(records) == 2 * len(digests)
    assert {r["quality"] for r in records} == {"complete"}
    subprocess.run(verify, cwd=ROOT, env=ENV, check=True, capture_output=True, timeout=60)


def _sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=30)


@pytest.fixture
def mirror_port() -> Iterator[tuple[str, str, str]]:
    """Namespaces a (client) and b (server) joined by a veth pair; tc mirrors both directions
    of a's end to a third veth whose other end (in the root namespace) is returned."""
    if shutil.which("tc") is None or shutil.which("ip") is None:
        pytest.skip("iproute2 (ip, tc) is not installed")
    tag = uuid.uuid4().hex[:6]
    ns_a, ns_b = f"vta{tag}", f"vtb{tag}"
    link, peer, mirror, tap = f"va{tag}", f"vb{tag}", f"vm{tag}", f"vt{tag}"
    try:
        _sh("ip", "netns", "add", ns_a)
        _sh("ip", "netns", "add", ns_b)
        _sh(
            "ip",
            "link",
            "add",
            link,
            "netns",
            ns_a,
            "type",
            "veth",
            "peer",
            "name",
            peer,
            "netns",
            ns_b,
        )
        _sh("ip", "link", "add", mirror, "netns", ns_a, "type", "veth", "peer", "name", tap)
        for ns, dev, addr in ((ns_a, link, "10.77.0.1/24"), (ns_b, peer, "10.77.0.2/24")):
            _sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", ns_a, "link", "set", mirror, "up")
        _sh("ip", "link", "set", tap, "up")
        _sh("ip", "netns", "exec", ns_a, "tc", "qdisc", "add", "dev", link, "clsact")
        for hook in ("ingress", "egress"):
            _sh(
                "ip",
                "netns",
                "exec",
                ns_a,
                "tc",
                "filter",
                "add",
                "dev",
                link,
                hook,
                "protocol",
                "all",
                "u32",
                "match",
                "u32",
                "0",
                "0",
                "action",
                "mirred",
                "egress",
                "mirror",
                "dev",
                mirror,
            )
        yield ns_a, ns_b, tap
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot build the mirror-port namespaces: {exc.stderr!r}")
    finally:
        for ns in (ns_a, ns_b):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", tap], check=False, capture_output=True, timeout=30)


def test_mirror_port_between_namespaces(tmp_path: Path, mirror_port: tuple[str, str, str]) -> None:
    ns_a, ns_b, tap = mirror_port
    port = 8000
    server = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns_b,
            sys.executable,
            str(HERE / "openai_server.py"),
            "10.77.0.2",
            str(port),
        ],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(["ip", "netns", "exec", ns_a], "10.77.0.2", port)
        collector = start_collector(tmp_path, tap, port)
        try:
            digests = run_client(["ip", "netns", "exec", ns_a], "10.77.0.2", port)
        finally:
            stop_collector(collector)
    finally:
        server.terminate()
        server.wait(timeout=30)
    records = export(tmp_path / "log")
    check_records(records, digests)
    flow = records["live-json"]["flow"]
    assert flow == {  # type: ignore[comparison-overlap]
        "ip_version": 4,
        "client_address": "10.77.0.1",
        "client_port": flow["client_port"],  # type: ignore[index]
        "server_address": "10.77.0.2",
        "server_port": 8000,
        "vlan_ids": [],
    }
