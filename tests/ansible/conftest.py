"""Keep ansible's interpreter patches inside the ansible tests.

Importing ansible.module_utils (the role modules these tests import, some at
collection time) replaces `sys.intern`, `socket.getaddrinfo` and
`dataclasses._is_type` with patch objects for the rest of the process.
torch._dynamo refuses a patched `sys.intern` at import, so every later test
that imports torch would fail. The originals are put back once collection is
over; each ansible test module runs with ansible's versions and gives the
originals back when it ends.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
from collections.abc import Iterator

import pytest

_PATCHED = ((sys, "intern"), (socket, "getaddrinfo"), (dataclasses, "_is_type"))
_Values = list[tuple[object, str, object]]


def _current() -> _Values:
    return [(owner, name, getattr(owner, name)) for owner, name in _PATCHED]


def _apply(values: _Values) -> None:
    for owner, name, value in values:
        setattr(owner, name, value)


_ORIGINALS = _current()
_ansible_versions: _Values = []


def pytest_collection_finish(session: pytest.Session) -> None:
    _ansible_versions[:] = _current()
    _apply(_ORIGINALS)


@pytest.fixture(autouse=True, scope="module")
def _ansible_patches_only_here() -> Iterator[None]:
    _apply(_ansible_versions)
    yield
    _apply(_ORIGINALS)
