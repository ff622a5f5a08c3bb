"""The systemd units: `systemd-analyze verify` silent, and `security` under a threshold.

verify and security run with ``--root`` on a fake root that holds the host's own
system units (so default dependencies like sysinit.target resolve), our units
in /etc/systemd/system, and stub executables at exactly the paths the units
name. The stubs come from a fixed list, not from parsing ExecStart=, so a typo
in a path is reported as a missing executable. systemd-analyze only *warns*
about unknown keys and bad values, so any output at all fails the test.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from appliance.command_line import EXIT_CONFIG

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "appliance" / "systemd"
VENV_BIN = "/opt/veritap/venv/bin"
#: What the units may execute: the wheel's console scripts and three system tools.
EXECUTABLES = (
    f"{VENV_BIN}/collector",
    f"{VENV_BIN}/verifierd",
    "/usr/sbin/ip",
    "/usr/sbin/ethtool",
    "/usr/bin/nvidia-modprobe",
)
#: Every unit as systemd-analyze should load it (a template through one instance).
UNIT_NAMES = (
    "veritap-collector.service",
    "veritap-verifierd.service",
    "veritap-nvidia-uvm.service",
    "veritap-capture-nic@eth1.service",
)
#: Highest `systemd-analyze security` exposure accepted (0 = locked down, 10 = none).
#: The daemons' values are what their hardening achieves today (collector 1.9,
#: verifierd 1.6); the helpers run as root by nature (module loading, NIC setup).
#: Neither daemon has ProcSubset=pid (+0.1): prometheus-client's process metrics
#: read /proc/stat, and vLLM reads /proc/meminfo and /proc/cpuinfo.
EXPOSURE_LIMITS = {
    "veritap-collector.service": 1.9,
    "veritap-verifierd.service": 1.6,
    "veritap-capture-nic@eth1.service": 2.6,
    "veritap-nvidia-uvm.service": 4.3,
}
SYSTEM_UNITS = Path("/usr/lib/systemd/system")

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None or not SYSTEM_UNITS.is_dir(),
    reason="needs systemd-analyze and the host's system units (Debian package systemd)",
)


def make_root(root: Path, units: Path = UNITS) -> Path:
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    shutil.copytree(units, root / "etc/systemd/system")
    for executable in EXECUTABLES:
        stub = root / executable.lstrip("/")
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    return root


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_verify_prints_nothing(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    result = analyze("verify", f"--root={root}", *UNIT_NAMES)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (("WatchdogSec=30s", "WatchdogSek=30s"), "Unknown key 'WatchdogSek'"),
        (("bin/collector run", "bin/colector run"), "colector is not executable"),
        (("RestrictAddressFamilies=AF_UNIX", "RestrictAddressFamilies=AF_UNIKS"), "AF_UNIKS"),
    ],
)
def test_verify_catches_damage(tmp_path: Path, damage: tuple[str, str], expected: str) -> None:
    """The check above can fail: a typo in a key, a path or a value is reported."""
    units = tmp_path / "units"
    shutil.copytree(UNITS, units)
    unit = units / "veritap-collector.service"
    unit.write_text(unit.read_text().replace(*damage))
    root = make_root(tmp_path / "root", units)
    result = analyze("verify", f"--root={root}", "veritap-collector.service")
    assert expected in result.stdout + result.stderr


@pytest.mark.parametrize("unit", sorted(EXPOSURE_LIMITS))
def test_security_exposure_is_under_the_limit(tmp_path: Path, unit: str) -> None:
    root = make_root(tmp_path)
    limit = EXPOSURE_LIMITS[unit]
    result = analyze(
        "security", "--offline=true", f"--root={root}", f"--threshold={round(limit * 10)}", unit
    )
    match = re.search(rf"Overall exposure level for {re.escape(unit)}: (\d+\.\d)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= limit
    assert result.returncode == 0, result.stdout


def test_units_run_the_wheels_console_scripts() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for daemon in ("collector", "verifierd"):
        assert daemon in scripts
        text = (UNITS / f"veritap-{daemon}.service").read_text()
        assert f"ExecStart={VENV_BIN}/{daemon} run --config /etc/veritap/{daemon}.toml" in text


def test_a_config_error_is_not_restarted() -> None:
    for daemon in ("collector", "verifierd"):
        lines = (UNITS / f"veritap-{daemon}.service").read_text().splitlines()
        assert "Restart=on-failure" in lines
        assert f"RestartPreventExitStatus={EXIT_CONFIG}" in lines


def test_collector_hardening_is_the_issue_list() -> None:
    text = (UNITS / "veritap-collector.service").read_text()
    for line in (
        "CapabilityBoundingSet=CAP_NET_RAW CAP_NET_ADMIN",
        "AmbientCapabilities=CAP_NET_RAW CAP_NET_ADMIN",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateDevices=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_PACKET AF_NETLINK",
        "SystemCallFilter=@system-service",
        "Type=notify",
        "Restart=on-failure",
    ):
        assert line in text.splitlines()


def test_verifier_is_limited_to_the_gpus() -> None:
    lines = (UNITS / "veritap-verifierd.service").read_text().splitlines()
    assert "DevicePolicy=closed" in lines
    assert "DeviceAllow=char-nvidia* rw" in lines
    assert "PrivateDevices=yes" not in lines
    after = next(line for line in lines if line.startswith("After="))
    assert "nvidia-persistenced.service" in after
