"""The collector role's capture-NIC module: ethtool parsing, and a real veth in a namespace."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.ansible.module_runner import import_module, run_module

nic = import_module("collector", "veritap_capture_nic")

SAMPLE = """Features for vtcap0:
rx-checksumming: on
tx-checksumming: on
\ttx-checksum-ipv4: off [fixed]
tcp-segmentation-offload: on
\ttx-tcp-segmentation: on
generic-segmentation-offload: on
generic-receive-offload: off
large-receive-offload: off [fixed]
rx-gro-hw: off [fixed]
hsr-dup-offload: off [fixed]
"""


def test_parse_features_reads_state_and_fixed() -> None:
    features = nic.parse_features(SAMPLE)
    assert features["tcp-segmentation-offload"] == (True, False)
    assert features["large-receive-offload"] == (False, True)
    assert features["tx-checksum-ipv4"] == (False, True)
    assert "Features for vtcap0" not in features


_feature = st.from_regex(r"[a-z][a-z0-9-]{0,30}", fullmatch=True)


@given(st.dictionaries(_feature, st.tuples(st.booleans(), st.booleans()), max_size=20))
def test_parse_features_round_trips(features: dict[str, tuple[bool, bool]]) -> None:
    lines = ["Features for x:"]
    for i, (name, (on, fixed)) in enumerate(features.items()):
        indent = "\t" if i % 2 else ""
        lines.append(f"{indent}{name}: {'on' if on else 'off'}{' [fixed]' if fixed else ''}")
    assert nic.parse_features("\n".join(lines)) == features


@given(st.text())
def test_parse_features_never_raises(text: str) -> None:
    nic.parse_features(text)


@pytest.fixture
def veth_namespace() -> Iterator[str]:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("ethtool"):
        pytest.skip("needs root, ip(8) and ethtool(8) for a network namespace with a veth pair")
    name = f"vt-nic-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(
            ["ip", "-n", name, "link", "add", "vtcap0", "type", "veth", "peer", "name", "vtpeer0"],
            check=True,
        )
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)


@pytest.mark.root
def test_module_sets_promisc_and_offloads_then_reports_no_change(veth_namespace: str) -> None:
    inside = ("ip", "netns", "exec", veth_namespace)
    args = {"interface": "vtcap0"}
    assert run_module("collector", "veritap_capture_nic", args, check=True, wrapper=inside)[
        "changed"
    ]
    first = run_module("collector", "veritap_capture_nic", args, wrapper=inside)
    assert first["changed"] is True, first
    assert "up promisc on" in first["changes"]
    second = run_module("collector", "veritap_capture_nic", args, wrapper=inside)
    assert second["changed"] is False, second

    flags_text = subprocess.run(
        [*inside, "cat", "/sys/class/net/vtcap0/flags"], capture_output=True, text=True, check=True
    ).stdout
    flags = int(flags_text, 16)
    assert flags & nic.IFF_PROMISC and flags & nic.IFF_UP
    shown = subprocess.run(
        [*inside, "ethtool", "-k", "vtcap0"], capture_output=True, text=True, check=True
    ).stdout
    features = nic.parse_features(shown)
    for short in ("gro", "lro", "tso", "gso"):
        on, fixed = features[nic.LONG_NAMES[short]]
        assert not on or (fixed and short in second["fixed_on"])


def test_missing_interface_fails() -> None:
    result = run_module("collector", "veritap_capture_nic", {"interface": "no-such-nic0"})
    assert result.get("failed") is True
    assert "no-such-nic0" in result["msg"]
