"""The two daemons' configuration files for the demo, written as TOML text.

Everything listens on 127.0.0.1: plaintext is allowed there and only there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DemoPorts:
    honest_prover: int
    dishonest_prover: int
    ledger: int
    verifier: int
    verifier_metrics: int
    collector_metrics: int
    prover_meter: int


def _quote(path: Path) -> str:
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def collector_toml(*, origin: str, log_dir: Path, key: Path, ports: DemoPorts) -> str:
    prover_ports = (ports.honest_prover, ports.dishonest_prover)
    bpf = " or ".join(f"tcp port {port}" for port in prover_ports)
    return f"""\
[collector]
origin = "{origin}"

[capture]
interface = "lo"
# Capturing on the sending host: checksum offload leaves them unfilled.
checksums = "ignore"
filter = "{bpf}"
server_ports = [{ports.honest_prover}, {ports.dishonest_prover}]
stats_interval_s = 2.0

[reassembly]
gap_timeout_s = 1.0

[log]
path = {_quote(log_dir)}
key = {_quote(key)}
batch_delay_s = 0.01

[ledger]
listen = "127.0.0.1:{ports.ledger}"
verifiers = ["demo-verifier"]

[metrics]
listen = "127.0.0.1:{ports.collector_metrics}"
"""


def verifierd_toml(
    *,
    state_dir: Path,
    commitments_dir: Path,
    origin: str,
    collector_pubkey: Path,
    ports: DemoPorts,
) -> str:
    return f"""\
[verifierd]
state_dir = {_quote(state_dir)}
key_file = {_quote(state_dir / "verifier.key")}
secret_file = {_quote(state_dir / "sampling.secret")}
commitments_dir = {_quote(commitments_dir)}
weights_dir = {_quote(state_dir / "weights")}
verifier_id = "demo-verifier"

[engines]
device = "cpu"
cpu_kv_space_gib = 1
idle_unload_s = 600

[scheduler]
poll_interval_s = 0.2

[service]
listen = "127.0.0.1:{ports.verifier}"

[metrics]
listen = "127.0.0.1:{ports.verifier_metrics}"
# The vca gauge reads the demo's prover meter (CPU-seconds of the provers' processes).
prover_url = "http://127.0.0.1:{ports.prover_meter}"
prover = "cpu"
vca_interval_s = 5

[[collectors]]
origin = "{origin}"
address = "127.0.0.1:{ports.ledger}"
public_key = {_quote(collector_pubkey)}
"""
