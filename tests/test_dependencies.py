"""pyproject.toml declares what each role imports, the locks pin it, the floors fit the
generated code.

Each role (a host kind) installs the base dependencies and its extras; every third-party
module its packages import, anywhere in a file, must come from one of those. Tests and
benchmarks take theirs from what `make install` installs (cpu, dev, systemd).
requirements/*.txt (`make lock`) pin every requirement of their role with hashes.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
FIRST_PARTY = frozenset({"collector", "verifierd", "tui", "appliance", "veritap", "tests"})
#: Packages each role runs, and the extras its host installs (verifier: either engine).
ROLES = {
    "collector": (("collector", "appliance", "protos/veritap"), ("collector", "systemd")),
    "verifier": (
        ("verifierd", "appliance", "protos/veritap"),
        ("verifier", "gpu", "cpu", "systemd"),
    ),
    "console": (("tui", "protos/veritap"), ("console",)),
}
LOCKS = {"collector": ("collector", "systemd"), "verifier": ("verifier", "gpu", "systemd")}
#: Imported, and released in lockstep with a declared distribution that requires it.
PROVIDED_BY = {"pydantic-core": "pydantic"}
_PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^ ;\\]+)", re.MULTILINE)


def _imports(folders: Iterable[str]) -> set[str]:
    """Top-level names of every absolute import in the folders' Python files."""
    names = set()
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_bytes())):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module.split(".")[0])
    return names - FIRST_PARTY - set(sys.stdlib_module_names)


def _requirements(extras: Iterable[str] = ()) -> list[Requirement]:
    """The base requirements and those of `extras`, self-references ("veritap[x]") expanded."""
    out = [Requirement(r) for r in PROJECT["dependencies"]]
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in PROJECT["optional-dependencies"][extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == "veritap":
                pending.extend(requirement.extras)
            else:
                out.append(requirement)
    return out


def _declared(extras: Iterable[str]) -> set[str]:
    return {canonicalize_name(r.name) for r in _requirements(extras)}


@functools.cache
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _distributions(module: str) -> set[str]:
    provided = _installed().get(module, [])
    return {PROVIDED_BY.get(n, n) for n in map(canonicalize_name, provided)}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_import_of_a_role_is_declared_for_it(role: str) -> None:
    folders, extras = ROLES[role]
    declared = _declared(extras)
    undeclared = {
        module: sorted(_distributions(module))
        for module in _imports(folders)
        if not _distributions(module) & declared
    }
    assert undeclared == {}


def test_tests_and_benchmarks_need_only_what_make_install_installs() -> None:
    declared = _declared(["cpu", "dev", "systemd"])
    beside = {path.stem for path in (REPO / "bench").glob("*.py")}  # bench scripts' neighbours
    imported = _imports(["tests", "bench"]) - beside
    undeclared = {m for m in imported if not _distributions(m) & declared}
    assert undeclared == set()


def test_test_only_packages_stay_out_of_the_roles() -> None:
    for role, (folders, extras) in ROLES.items():
        assert "dpkt" not in _imports(folders), role
        assert "dpkt" not in _declared(extras), role
    everything = _declared(PROJECT["optional-dependencies"])
    assert "scapy" not in everything  # GPL-2.0, and never imported


def _pins(lock: Path) -> dict[str, list[Version]]:
    text = lock.read_text()
    pins: dict[str, list[Version]] = {}
    for name, version in _PIN.findall(text):
        pins.setdefault(canonicalize_name(name), []).append(Version(version))
    return pins


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_a_lock_pins_every_requirement_of_its_role_with_hashes(lock: str) -> None:
    path = REPO / "requirements" / f"{lock}.txt"
    pins = _pins(path)
    for requirement in _requirements(LOCKS[lock]):
        versions = pins.get(canonicalize_name(requirement.name))
        assert versions, f"{requirement.name} is not in {path.name}: run make lock"
        assert all(requirement.specifier.contains(v, prereleases=True) for v in versions), (
            f"{path.name} pins {requirement.name} {versions}, outside {requirement.specifier}"
        )
    blocks = re.split(r"\n(?=[A-Za-z0-9._-]+==)", path.read_text().split("\n", 2)[2])
    assert len(blocks) == sum(len(v) for v in pins.values())
    assert all("--hash=sha256:" in block for block in blocks)


def _generated_versions() -> tuple[Version, Version]:
    """The protobuf runtime and grpcio versions the generated code requires."""
    generated = REPO / "protos" / "veritap" / "v1"
    protobuf = grpcio = Version("0")
    for path in generated.glob("*_pb2.py"):
        found = re.search(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", path.read_text())
        assert found, path
        protobuf = max(protobuf, Version(".".join(found.groups())))
    for path in generated.glob("*_pb2_grpc.py"):
        found = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", path.read_text())
        assert found, path
        grpcio = max(grpcio, Version(found.group(1)))
    return protobuf, grpcio


def test_the_floors_are_what_the_generated_code_requires() -> None:
    protobuf, grpcio = _generated_versions()
    base = {canonicalize_name(r.name): r.specifier for r in _requirements()}
    for name, generated in (("protobuf", protobuf), ("grpcio", grpcio)):
        major, minor, micro = generated.release
        older = Version(f"{major}.{minor}.{micro - 1}" if micro else f"{major}.{minor - 1}.999")
        assert base[name].contains(generated) and not base[name].contains(older), name
