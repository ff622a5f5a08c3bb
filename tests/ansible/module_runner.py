"""Run one of the roles' Ansible modules directly, as Ansible runs it on a host.

An Ansible module is a script that reads ``{"ANSIBLE_MODULE_ARGS": {...}}`` from
the file named by its first argument and prints one JSON result; running it
that way exercises the real module without a playbook around it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

ROLES = Path(__file__).resolve().parents[2] / "ansible" / "roles"


def module_path(role: str, name: str) -> Path:
    return ROLES / role / "library" / f"{name}.py"


def run_module(
    role: str,
    name: str,
    args: dict[str, Any],
    *,
    check: bool = False,
    wrapper: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The module's JSON result (``failed`` is set when it failed).

    `wrapper` prefixes the command, e.g. ``("ip", "netns", "exec", NS)``.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".json") as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check}}, handle)
        handle.flush()
        proc = subprocess.run(
            [*wrapper, sys.executable, str(module_path(role, name)), handle.name],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    try:
        result: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{name} printed no JSON: {proc.stdout!r} {proc.stderr!r}") from exc
    return result


def import_module(role: str, name: str) -> ModuleType:
    """Import a module file for its pure functions (parsers, digests)."""
    spec = importlib.util.spec_from_file_location(f"veritap_role_{name}", module_path(role, name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
