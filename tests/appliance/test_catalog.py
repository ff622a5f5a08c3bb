"""The journald catalog: one entry per MessageId, accepted by journalctl's own catalog
builder as the playbook runs it (into a root directory here)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from appliance.journal import MessageId

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "appliance" / "catalog" / "veritap.catalog"
_ENTRY = re.compile(r"^-- ([0-9a-f]{32})$", re.MULTILINE)


def test_every_message_id_has_one_entry() -> None:
    ids = _ENTRY.findall(CATALOG.read_text())
    assert sorted(ids) == sorted(message.value for message in MessageId)
    assert len(set(ids)) == len(ids)


def test_message_ids_are_distinct_128_bit_ids() -> None:
    values = [message.value for message in MessageId]
    assert len(set(values)) == len(values)
    assert all(re.fullmatch(r"[0-9a-f]{32}", value) for value in values)


@pytest.mark.skipif(shutil.which("journalctl") is None, reason="needs journalctl (systemd)")
def test_journalctl_builds_the_catalog_and_lists_every_entry(tmp_path: Path) -> None:
    installed = tmp_path / "usr/lib/systemd/catalog"
    installed.mkdir(parents=True)
    shutil.copy(CATALOG, installed / CATALOG.name)
    update = subprocess.run(
        ["journalctl", f"--root={tmp_path}", "--update-catalog"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (update.returncode, update.stderr) == (0, "")
    listed = subprocess.run(
        ["journalctl", f"--root={tmp_path}", "--list-catalog"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for message in MessageId:
        assert re.search(rf"^{message.value} veritap: \S", listed, re.MULTILINE), listed
