"""The common role's sysusers module, creating users for real inside a scratch root."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.ansible.module_runner import import_module, run_module

APPLIANCE = Path(__file__).resolve().parents[2] / "appliance"
sysusers = import_module("common", "veritap_sysusers")


def test_parse_the_shipped_files() -> None:
    text = (APPLIANCE / "sysusers.d" / "veritap-collector.conf").read_text()
    users, groups, members = sysusers.parse_sysusers(text)
    assert users == ["veritap-collector"]
    assert groups == ["veritap", "veritap-collector"]
    assert members == [("veritap-collector", "veritap")]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    if shutil.which("systemd-sysusers") is None:
        pytest.skip("systemd-sysusers is not installed")
    (tmp_path / "etc" / "sysusers.d").mkdir(parents=True)
    for name in ("veritap-collector.conf", "veritap-verifier.conf"):
        shutil.copy(APPLIANCE / "sysusers.d" / name, tmp_path / "etc" / "sysusers.d" / name)
    return tmp_path


def test_users_are_created_once_and_their_ids_returned(root: Path) -> None:
    args = {
        "root": str(root),
        "files": [
            "/etc/sysusers.d/veritap-collector.conf",
            "/etc/sysusers.d/veritap-verifier.conf",
        ],
    }
    planned = run_module("common", "veritap_sysusers", args, check=True)
    assert planned["changed"] is True
    assert not (root / "etc" / "passwd").exists()

    first = run_module("common", "veritap_sysusers", args)
    assert first["changed"] is True, first
    passwd = {
        line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().split()
    }
    for user in ("veritap-collector", "veritap-verifier"):
        assert first["users"][user] == {"uid": int(passwd[user][2]), "gid": int(passwd[user][3])}
    group = (root / "etc/group").read_text()
    assert f"veritap:x:{first['groups']['veritap']}:veritap-collector,veritap-verifier" in group

    second = run_module("common", "veritap_sysusers", args)
    assert second["changed"] is False
    assert second["users"] == first["users"]
