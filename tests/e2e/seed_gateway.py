"""veritap's seed gateway (appliance/gateway/) run by Debian's nginx on loopback.

The test configuration is the shipped one: the same ``seed-locations.conf``
and ``seed.js``, included in a server that listens on a free loopback port and
proxies to ``upstream``; only the paths nginx writes to are the test's own.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from verifierd.demo.processes import ProcessGroup, free_port, port_open

GATEWAY_DIR = Path(__file__).resolve().parents[2] / "appliance" / "gateway"
#: Where Debian's libnginx-mod-http-js puts the module.
JS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")
NGINX = shutil.which("nginx", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"]))


def gateway_missing() -> str | None:
    """Why the gateway cannot run here (the Makefile's system-deps installs it), or None."""
    if NGINX is None:
        return "nginx is not installed (Debian package nginx)"
    if not JS_MODULE.exists():
        return f"{JS_MODULE} is missing (Debian package libnginx-mod-http-js)"
    return None


@dataclass(frozen=True)
class Gateway:
    port: int
    #: The nginx master's process id (its workers are its children).
    pid: int
    error_log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def worker_cpu_s(self) -> float:
        """CPU seconds used so far by the nginx workers: their time on a CPU, user and
        system, to the nanosecond (/proc/PID/schedstat)."""
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        stats = (Path(f"/proc/{pid}/schedstat").read_text() for pid in children)
        return sum(int(stat.split()[0]) for stat in stats) / 1e9


def nginx_config(work: Path, http: str) -> str:
    """A whole nginx.conf whose files are under ``work``, with ``http`` in its http block.

    Its workers run as root when the test does (else nobody, who cannot write into
    pytest's private temporary folders)."""
    temp = {name: work / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    return f"""
load_module {JS_MODULE};
daemon off;
{"user root;" if os.geteuid() == 0 else ""}
worker_processes 1;
pid {work / "nginx.pid"};
error_log {work / "error.log"} info;
events {{}}
http {{
    access_log off;
    client_body_temp_path {temp["body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
{http}
}}
"""


def _gateway_http(upstream: tuple[str, int], port: int, locations: Path) -> str:
    return f"""
    js_path "{GATEWAY_DIR}/";
    upstream veritap_prover {{
        server {upstream[0]}:{upstream[1]};
        keepalive 8;
    }}
    server {{
        listen 127.0.0.1:{port};
        include {locations};
    }}
"""


@contextmanager
def seed_gateway(
    work: Path, upstream: tuple[str, int], locations: Path = GATEWAY_DIR / "seed-locations.conf"
) -> Iterator[Gateway]:
    """nginx running the seed gateway (``locations``: the shipped ones unless a test
    changes them) in front of ``upstream`` until the block ends."""
    missing = gateway_missing()
    if missing is not None or NGINX is None:
        raise RuntimeError(missing)
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = work / "nginx.conf"
    config.write_text(nginx_config(work, _gateway_http(upstream, port, locations)))
    argv = [NGINX, "-c", str(config), "-p", str(work), "-e", str(work / "error.log")]
    with ProcessGroup(work / "logs") as group:
        child = group.start("nginx", argv)
        group.wait_until("the gateway", lambda: port_open("127.0.0.1", port), 30)
        yield Gateway(port, child.process.pid, work / "error.log")
