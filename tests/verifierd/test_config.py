"""verifierd's TOML configuration: defaults, validation messages, relative paths."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.config_schema import ConfigError, LogLevel

from verifierd.config import load_config, parse_config


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
        (
            "[engines]\nidle_unload_s = 'soon'",
            "engines.idle_unload_s: expected a number",
        ),
        ("[engines]\nidle_unload_sec = 3", "engines.idle_unload_sec: unknown key"),
        ("[engine]\n", "engine: unknown key"),
        ("[engines]\ndevice = 'tpu'", "engines.device: expected 'cpu' or 'cuda'"),
        ("[engines]\ndevice = 'cuda'", "engines.gpu_indices: device 'cuda' needs"),
        (
            "[engines]\ngpu_memory_utilization = 1.5",
            "engines.gpu_memory_utilization: must be <= 1.0",
        ),
        ("[scheduler]\nmax_attempts = 0", "scheduler.max_attempts: must be >= 1, got 0"),
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
        ("collectors = 3", "collectors: expected an array, got 3"),
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


def test_every_bad_key_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    path.write_text(
        "[verifierd]\nverifier_id = ''\n[store]\nmap_size_gib = nan\n"
        "[engines]\ndevice = 'tpu'\nmax_batch_tokens = 0\n"
        "[[collectors]]\norigin = 'a'\n[log]\nlevel = 'loud'\n[bogus]\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [problem.partition(":")[0] for problem in caught.value.problems] == [
        "verifierd.verifier_id",
        "store.map_size_gib",
        "engines.device",
        "engines.max_batch_tokens",
        "collectors[0].address",
        "collectors[0].public_key",
        "log.level",
        "bogus",
    ]


def test_log_level_defaults_to_info() -> None:
    assert parse_config({}, Path("/")).log.level is LogLevel.INFO
    assert parse_config({"log": {"level": "debug"}}, Path("/")).log.level is LogLevel.DEBUG


def test_provers_and_their_hiding_rates() -> None:
    provers = parse_config(
        {
            "provers": {
                "windows_s": [86400, 600],
                "hiding": {"window_s": 600, "reasons": {"no_output": 0.9, "no_seed": 1}},
            }
        },
        Path("/"),
    ).provers
    assert provers.windows_s == (600, 86400)
    assert provers.hiding.reasons == (("no_seed", 1.0), ("no_output", 0.9))
    assert (provers.hiding.rate("no_output"), provers.hiding.rate("capture_gap")) == (0.9, 0.5)


@pytest.mark.parametrize(
    ("provers", "message"),
    [
        ({"windows_s": [600, 600]}, "provers.windows_s: a window appears twice"),
        ({"windows_s": [30]}, "provers.windows_s[0]: must be >= 60, got 30"),
        ({"windows_s": []}, "provers.windows_s: expected at least 1 item(s)"),
        ({"hiding": {"window_s": 7200}}, "provers.hiding.window_s: 7200 is not one of"),
        ({"hiding": {"reasons": {"no_seed": 2}}}, "provers.hiding.reasons.no_seed: must be <="),
        ({"hiding": {"reasons": {"weights_mismatch": 0.1}}}, "hiding.reasons.weights_mismatch:"),
        ({"hiding": {"reasons": 0.5}}, "provers.hiding.reasons: expected a table, got 0.5"),
        ({"false_alarm_per_day": 0}, "provers.false_alarm_per_day: must be > 0.0, got 0"),
    ],
)
def test_bad_provers_settings_name_the_key(provers: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config({"provers": provers}, Path("/"))
