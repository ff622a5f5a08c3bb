"""The example configs are valid for the daemons' own loaders and match the units."""

from __future__ import annotations

from pathlib import Path

from collector.config import load_config as load_collector_config
from verifierd.config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "appliance" / "config"


def test_verifierd_example_loads() -> None:
    config = load_config(CONFIG / "verifierd.toml")
    assert config.state_dir == Path(
        "/var/lib/veritap/verifierd"
    )  # StateDirectory=veritap/verifierd
    assert config.engines.device == "cuda"
    assert config.service.cert_file == "/etc/veritap/tls/host.pem"
    assert config.service.admin_subjects == ("veritap-operator",)
    (collector,) = config.collectors
    assert collector.public_key == "/etc/veritap/keys/collectors/tap-01.vkey"


def test_collector_example_loads() -> None:
    config = load_collector_config(CONFIG / "collector.toml")
    assert config.origin == "veritap.example/tap-01"
    assert config.log.path == Path("/var/lib/veritap/collector/log")  # StateDirectory=
    assert config.log.key == Path("/etc/veritap/keys/collector.key")
    assert config.capture.filter.startswith("tcp port 8000")
    ledger = config.ledger
    assert ledger.tls is not None and ledger.tls.client_ca == Path("/etc/veritap/tls/ca.pem")
    assert ledger.verifiers == ("cray-xd670-01", "g294-z21-01", "g294-z21-02")
