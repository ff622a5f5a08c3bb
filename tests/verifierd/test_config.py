"""verifierd's TOML configuration: defaults, validation messages, relative paths."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.config import ConfigError, load_config, parse_config


def test_empty_file_gives_working_defaults(tmp_path: Path) -> None:
    path = tmp_path / "verifierd.toml"
    path.write_text("")
    config = load_config(path)
    assert config.state_dir == tmp_path / "verifierd-state"
    assert config.store_dir == tmp_path / "verifierd-state" / "store"
    assert config.key_file == tmp_path / "verifierd-state" / "verifier.key"
    assert config.engines.device == "cpu"
    assert config.scheduler.max_attempts >= 1
    assert config.collectors == ()


def test_full_file(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    path.write_text(
        """
[verifierd]
state_dir = "/var/lib/verifierd"
commitments_dir = "commitments"
verifier_id = "gpu-1"

[store]
map_size_gib = 4

[engines]
device = "cuda"
gpu_indices = [0, 1, 2, 3]
gpu_memory_utilization = 0.9
idle_unload_s = 60

[scheduler]
max_attempts = 3

[service]
listen = "0.0.0.0:50061"
cert_file = "tls/server.pem"
key_file = "tls/server.key"
admin_subjects = ["CN=ops-admin,O=veritap"]

[[collectors]]
origin = "edge-1"
address = "10.0.0.2:50051"
public_key = "keys/edge-1.pub"
models = ["llama"]
"""
    )
    config = load_config(path)
    assert config.state_dir == Path("/var/lib/verifierd")
    assert config.key_file == Path("/var/lib/verifierd/verifier.key")
    assert config.commitments_dir == tmp_path / "commitments"
    assert config.engines.gpu_indices == (0, 1, 2, 3)
    assert config.engines.idle_unload_s == 60.0
    assert config.service.cert_file == str(tmp_path / "tls/server.pem")
    assert config.service.admin_subjects == ("CN=ops-admin,O=veritap",)
    assert config.collectors[0].models == ("llama",)
    assert config.collectors[0].window == 4096


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[engines]\nidle_unload_s = 'soon'", "engines.idle_unload_s: expected a number >= 0.0"),
        ("[engines]\nidle_unload_sec = 3", "engines.idle_unload_sec: unknown key"),
        ("[engine]\n", "engine: unknown key"),
        ("[engines]\ndevice = 'tpu'", "engines.device: expected 'cpu' or 'cuda'"),
        ("[engines]\ndevice = 'cuda'", "engines.gpu_indices: device 'cuda' needs"),
        ("[engines]\ngpu_memory_utilization = 1.5", "engines.gpu_memory_utilization: expected"),
        ("[scheduler]\nmax_attempts = 0", "scheduler.max_attempts: expected an integer >= 1"),
        ("[scheduler]\nmax_attempts = true", "scheduler.max_attempts: expected an integer"),
        ("[[collectors]]\norigin = 'a'\naddress = 'x:1'", "collectors[0].public_key: required"),
        (
            "[[collectors]]\norigin='a'\naddress='x:1'\npublic_key='k'\ncert_file='c'",
            "collectors[0]: cert_file and key_file go together",
        ),
        (
            "[[collectors]]\norigin='a'\naddress='x:1'\npublic_key='k'\n"
            "[[collectors]]\norigin='a'\naddress='y:1'\npublic_key='k'",
            "collectors: origin 'a' is listed more than once",
        ),
        ("verifierd = 3", "verifierd: expected a table"),
        ("collectors = 3", "collectors: expected an array of tables"),
        ("[verifierd]\nstate_dir = ''", "verifierd.state_dir: expected a non-empty string"),
        ("x = [", "not valid TOML"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "v.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml")


_KEYS = st.sampled_from(
    [
        "verifierd",
        "store",
        "engines",
        "scheduler",
        "service",
        "collectors",
        "state_dir",
        "device",
        "idle_unload_s",
        "gpu_indices",
        "max_attempts",
        "origin",
        "address",
        "public_key",
        "models",
        "listen",
        "bogus",
    ]
)
_SCALARS = st.one_of(
    st.booleans(),
    st.integers(-5, 10),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.lists(st.integers(-1, 3), max_size=3),
)
_DOCS = st.recursive(
    st.dictionaries(_KEYS, _SCALARS, max_size=4),
    lambda inner: st.dictionaries(_KEYS, st.one_of(_SCALARS, inner, st.lists(inner, max_size=2))),
    max_leaves=12,
)


@settings(deadline=None)
@given(_DOCS)
def test_any_document_parses_or_names_a_problem(doc: dict[str, Any]) -> None:
    try:
        parse_config(doc, Path("/etc/verifierd"))
    except ConfigError as exc:
        assert ":" in str(exc)


def test_infinite_numbers_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"store\.map_size_gib"):
        parse_config({"store": {"map_size_gib": float("inf")}}, Path("/"))
