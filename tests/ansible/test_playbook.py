"""The playbook: lint, syntax, and a real apply into a scratch root, run twice.

The apply uses the example inventory with two of its hosts (the tap node and
the NVSwitch Cray), ``connection: local`` and ``veritap_root`` pointing every
path the roles write into a per-host scratch directory. What is real: the
service users (systemd-sysusers inside the scratch root), the PKI, the venv
with the veritap wheel built from this checkout (``--no-deps``: the CUDA and
vLLM dependencies are not installed in CI), the weights sync against a
commitment made by verifierd's own code, the units and configs, and, as root,
the capture NIC (a veth in a network namespace the whole playbook runs in).
What is switched off: systemctl (no systemd as PID 1 here) and apt. The second
run must report ``changed=0`` for every host.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from veritap.signing import Signer, Verifier

from appliance.command_line import EXIT_CONFIG
from collector.config import load_config as load_collector_config
from tests.ansible.committed_model import CommittedModel, make_committed_model
from verifierd.commitments import load_commitment
from verifierd.config import load_config as load_verifierd_config
from verifierd.weights_cache import WeightsCache

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
BIN = Path(sys.executable).parent
HOSTS = ("tap-01", "cray-xd670-01")
CAPTURE_NIC = "vtcap0"
_RECAP = re.compile(
    r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE
)


def ansible_env(scratch: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(scratch / "ansible-local"),
        "ANSIBLE_REMOTE_TEMP": str(scratch / "ansible-remote"),
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
    }


def test_lint_at_the_production_profile(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(BIN / "ansible-lint"), "--offline", "--profile", "production", "--nocolor"],
        cwd=ANSIBLE,
        env=ansible_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_syntax_check(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), "--syntax-check", "-i", "inventories/example", "site.yml"],
        cwd=ANSIBLE,
        env=ansible_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@dataclass(frozen=True)
class Recap:
    ok: int
    changed: int
    unreachable: int
    failed: int


@dataclass(frozen=True)
class Applied:
    scratch: Path
    pki: Path
    model: CommittedModel
    namespace: str | None
    runs: tuple[tuple[dict[str, Recap], str], ...]

    def root(self, host: str) -> Path:
        return self.scratch / "roots" / host


def parse_recap(output: str) -> dict[str, Recap]:
    return {
        m.group(1): Recap(*(int(m.group(i)) for i in range(2, 6))) for m in _RECAP.finditer(output)
    }


def build_wheel(out: Path) -> Path:
    """The veritap wheel of this checkout, as the operator builds it for the playbook."""
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)]
    try:
        import hatchling  # noqa: F401  (present: build without fetching the backend)

        command.insert(4, "--no-build-isolation")
    except ImportError:
        pass
    subprocess.run(command, check=True, timeout=600, capture_output=True)
    (wheel,) = out.glob("veritap-*.whl")
    return wheel


def write_lock(path: Path, wheel: Path) -> Path:
    """A lock in the form of requirements/*.txt that pins only the wheel (CI installs no
    dependencies), so the playbook's --require-hashes step runs for real."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    path.write_text(f"veritap @ {wheel.as_uri()} \\\n    --hash=sha256:{digest}\n")
    return path


@pytest.fixture(scope="module")
def network_namespace() -> Iterator[str | None]:
    """A namespace holding a veth pair whose end CAPTURE_NIC plays the tap port (root only)."""
    if shutil.which("ip") is None or shutil.which("ethtool") is None:
        yield None
        return
    name = f"vt-play-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(
            ["ip", "-n", name, "link", "add", CAPTURE_NIC, "type", "veth", "peer", "name", "vtp0"],
            check=True,
        )
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory, network_namespace: str | None) -> Applied:
    if os.geteuid() != 0:
        pytest.skip(
            "needs root: the roles chown files to the users they create in the scratch root"
        )
    if shutil.which("systemd-sysusers") is None:
        pytest.skip("needs systemd-sysusers (Debian package systemd)")
    scratch = tmp_path_factory.mktemp("apply")
    model = make_committed_model(scratch)
    wheel = build_wheel(scratch / "dist")
    overrides = {
        "ansible_connection": "local",
        "ansible_become": False,
        "ansible_python_interpreter": sys.executable,
        "common_python": sys.executable,
        "veritap_root": f"{scratch}/roots/{{{{ inventory_hostname }}}}",
        "veritap_manage_services": False,
        "veritap_manage_packages": False,
        "veritap_wheel": str(wheel),
        "veritap_wheel_extras": [],
        "veritap_requirements_lock": str(write_lock(scratch / "requirements.txt", wheel)),
        "veritap_pip_extra_args": "--no-deps --no-index",
        "veritap_pki_dir": str(scratch / "pki"),
        "verifier_require_nvidia": False,
        "verifier_commitments_src": str(model.commitment_file.parent),
        "verifier_commitments": [
            {
                "file": model.commitment_file.name,
                "source": str(model.model_dir),
                "tensor_parallel_size": 1,
            }
        ],
        # The venv holds the wheel without its dependencies: the checkout's scripts validate.
        "collector_check_config": f"{BIN}/collector check-config --config %s",
        "verifier_check_config": f"{BIN}/verifierd check-config --config %s",
        "collector_capture_interface": CAPTURE_NIC,
        "collector_manage_nic": network_namespace is not None,
    }
    (scratch / "overrides.yml").write_text(yaml.safe_dump(overrides))
    command = [
        str(BIN / "ansible-playbook"),
        "-i",
        "inventories/example",
        "--limit",
        ",".join(HOSTS),
        "-e",
        f"@{scratch / 'overrides.yml'}",
        "site.yml",
    ]
    if network_namespace is not None:
        command = ["ip", "netns", "exec", network_namespace, *command]
    runs = []
    for _ in range(2):
        result = subprocess.run(
            command,
            cwd=ANSIBLE,
            env=ansible_env(scratch),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        runs.append((parse_recap(output), output))
    return Applied(scratch, scratch / "pki", model, network_namespace, tuple(runs))


def test_first_run_configures_both_hosts(applied: Applied) -> None:
    recap, output = applied.runs[0]
    assert sorted(recap) == sorted(HOSTS), output
    for host in HOSTS:
        assert recap[host].failed == recap[host].unreachable == 0, output
        assert recap[host].changed > 0, output


def test_second_run_changes_nothing(applied: Applied) -> None:
    recap, output = applied.runs[1]
    assert sorted(recap) == sorted(HOSTS), output
    for host in HOSTS:
        assert recap[host] == Recap(recap[host].ok, 0, 0, 0), output


def test_service_users_exist_in_the_root(applied: Applied) -> None:
    for host, user in (("tap-01", "veritap-collector"), ("cray-xd670-01", "veritap-verifier")):
        passwd = (applied.root(host) / "etc/passwd").read_text()
        assert re.search(rf"^{user}:x:\d+:\d+:", passwd, re.MULTILINE)


def test_configs_load_with_the_daemons_loaders(applied: Applied) -> None:
    collector = load_collector_config(applied.root("tap-01") / "etc/veritap/collector.toml")
    assert collector.origin == "veritap.example/tap-01"
    assert collector.capture.interface == CAPTURE_NIC
    assert collector.ledger.verifiers == ("cray-xd670-01", "g294-z21-01", "g294-z21-02")
    verifier = load_verifierd_config(applied.root("cray-xd670-01") / "etc/veritap/verifierd.toml")
    assert verifier.verifier_id == "cray-xd670-01"
    assert verifier.engines.gpu_indices == tuple(range(8))
    assert verifier.service.admin_subjects == ("veritap-operator",)
    (pinned,) = verifier.collectors
    assert (pinned.origin, pinned.address) == ("veritap.example/tap-01", "192.0.2.11:7700")


def test_the_collector_key_is_pinned_on_the_verifier(applied: Applied) -> None:
    signer = Signer.load(applied.root("tap-01") / "etc/veritap/keys/collector.key")
    pinned = Verifier.load(
        applied.root("cray-xd670-01") / "etc/veritap/keys/collectors/tap-01.vkey"
    )
    assert signer.name == "veritap.example/tap-01"
    assert pinned.key_string() == signer.verifier().key_string()


def test_secrets_are_readable_only_by_their_service(applied: Applied) -> None:
    root = applied.root("tap-01")
    passwd = {
        line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().split()
    }
    key = (root / "etc/veritap/keys/collector.key").stat()
    assert (key.st_mode & 0o777, key.st_uid, key.st_gid) == (
        0o640,
        0,
        int(passwd["veritap-collector"][3]),
    )
    tls_key = (root / "etc/veritap/tls/host.key").stat()
    assert tls_key.st_mode & 0o777 == 0o640
    assert (applied.pki / "ca.key").stat().st_mode & 0o777 == 0o600


def test_verifierd_accepts_the_weights_without_rehashing(applied: Applied) -> None:
    root = applied.root("cray-xd670-01")
    commitment = load_commitment(
        root / "etc/veritap/commitments" / applied.model.commitment_file.name
    )
    cache = WeightsCache(root / "var/lib/veritap/verifierd/weights")
    assert cache.verify(commitment).files_hashed == 0


@pytest.mark.parametrize(
    ("role", "daemon"), [("collector", "collector"), ("verifier", "verifierd")]
)
def test_rendered_configs_are_checked_before_they_replace_the_installed_one(
    role: str, daemon: str, tmp_path: Path
) -> None:
    tasks = yaml.safe_load((ANSIBLE / "roles" / role / "tasks/main.yml").read_text())
    (task,) = [
        t
        for t in tasks
        if t.get("ansible.builtin.template", {}).get("src", "").endswith(f"{daemon}.toml.j2")
    ]
    assert task["ansible.builtin.template"]["validate"] == f"{{{{ {role}_check_config }}}}"
    defaults = yaml.safe_load((ANSIBLE / "roles" / role / "defaults/main.yml").read_text())
    command = defaults[f"{role}_check_config"]
    assert command.startswith("{{ veritap_root }}{{ veritap_venv }}/bin/")
    assert command.endswith(f"/{daemon} check-config --config %s")
    bad = tmp_path / "rendered.toml"
    bad.write_text("[log]\nlevel = 'loud'\n")
    here = command.replace("{{ veritap_root }}{{ veritap_venv }}/bin", str(BIN))
    argv = here.replace("%s", str(bad)).split()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == EXIT_CONFIG and "log.level" in result.stderr


def test_the_journal_catalog_is_installed_and_built(applied: Applied) -> None:
    catalog = REPO / "appliance/catalog/veritap.catalog"
    for host in HOSTS:
        root = applied.root(host)
        installed = root / "usr/lib/systemd/catalog/veritap.catalog"
        assert installed.read_bytes() == catalog.read_bytes()
        assert (root / "var/lib/systemd/catalog/database").stat().st_size > 0


def test_units_are_installed_as_shipped(applied: Applied) -> None:
    units = REPO / "appliance/systemd"
    system = applied.root("tap-01") / "etc/systemd/system"
    for name in ("veritap-collector.service", "veritap-capture-nic@.service"):
        assert (system / name).read_bytes() == (units / name).read_bytes()
    system = applied.root("cray-xd670-01") / "etc/systemd/system"
    for name in ("veritap-verifierd.service", "veritap-verifierd.service.d/nvswitch.conf"):
        assert (system / name).read_bytes() == (units / name).read_bytes()


def test_the_venv_holds_the_wheels_console_scripts(applied: Applied) -> None:
    for host, script in (("tap-01", "collector"), ("cray-xd670-01", "verifierd")):
        assert (applied.root(host) / "opt/veritap/requirements.txt").is_file()
        path = applied.root(host) / "opt/veritap/venv/bin" / script
        assert os.access(path, os.X_OK)
        assert f"from {script}.cli import main" in path.read_text()


def test_the_capture_interface_is_ready(applied: Applied) -> None:
    if applied.namespace is None:
        pytest.skip("no ip(8)/ethtool(8): the capture NIC part ran with collector_manage_nic off")
    inside = ("ip", "netns", "exec", applied.namespace)
    flags = int(
        subprocess.run(
            [*inside, "cat", f"/sys/class/net/{CAPTURE_NIC}/flags"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout,
        16,
    )
    assert flags & 0x100 and flags & 0x1  # IFF_PROMISC, IFF_UP
    features = subprocess.run(
        [*inside, "ethtool", "-k", CAPTURE_NIC], capture_output=True, text=True, check=True
    ).stdout
    for name in ("generic-receive-offload", "tcp-segmentation-offload"):
        assert re.search(rf"^{name}: off", features, re.MULTILINE), features
