"""The playbook's gateway role, applied twice into a scratch root from its own inventory.

It installs appliance/gateway/ where DEPLOYMENT.md puts it: seed.js and
seed-locations.conf as shipped, and the site rendered for the inventory's
provers and port (for the role's defaults, the shipped veritap-gateway.conf,
which tests/appliance/test_seed_gateway.py checks with `nginx -t`). Packages
and services are switched off as in the playbook test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.ansible.test_playbook import ANSIBLE, BIN, REPO, Recap, ansible_env, parse_recap

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the role chowns what it installs to root"
)
GATEWAY = REPO / "appliance" / "gateway"


def _apply(scratch: Path, host_vars: dict[str, object]) -> tuple[Path, list[Recap]]:
    """The root the role wrote into and each of two runs' recap for the host."""
    root = scratch / "root"
    host = {
        "ansible_connection": "local",
        "ansible_become": False,
        "ansible_python_interpreter": sys.executable,
        "veritap_root": str(root),
        "veritap_manage_services": False,
        "veritap_manage_packages": False,
        "veritap_appliance_dir": str(REPO / "appliance"),
        **host_vars,
    }
    inventory = scratch / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump({"all": {"children": {"gateways": {"hosts": {"gw-01": host}}}}})
    )
    recaps = []
    for _ in range(2):
        result = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inventory), "site.yml"],
            cwd=ANSIBLE,
            env=ansible_env(scratch),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        recaps.append(parse_recap(output)["gw-01"])
    return root, recaps


def test_defaults_install_the_shipped_gateway_and_a_second_run_changes_nothing(
    tmp_path: Path,
) -> None:
    root, (first, second) = _apply(tmp_path, {})
    assert first.failed == first.unreachable == 0 and first.changed > 0
    assert second == Recap(second.ok, 0, 0, 0)
    for name in ("seed.js", "seed-locations.conf"):
        assert (root / "etc/nginx/veritap" / name).read_bytes() == (GATEWAY / name).read_bytes()
    site = root / "etc/nginx/conf.d/veritap-gateway.conf"
    assert site.read_text() == (GATEWAY / "veritap-gateway.conf").read_text()


def test_the_site_names_the_inventorys_provers_and_port(tmp_path: Path) -> None:
    provers = ["10.1.0.5:8000", "[fd00::6]:8001"]
    root, _ = _apply(tmp_path, {"gateway_provers": provers, "gateway_listen": "9443"})
    site = (root / "etc/nginx/conf.d/veritap-gateway.conf").read_text()
    assert "    server 10.1.0.5:8000;\n    server [fd00::6]:8001;\n" in site
    assert "    listen 9443;\n" in site
