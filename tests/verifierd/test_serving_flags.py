"""The prover's serving flags in the commitment: additive, round-tripping, checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cpu_bound import budget, cpu_bound
from tests.verifierd.commitment_fixtures import commit, make_model_dir
from verifierd.cli import main as cli_main
from verifierd.commitments import CommitmentError, load_commitment, parse_commitment
from verifierd.serving_flags import VLLM_DEFAULTS, ServingFlags, ServingFlagsError

TOOLS = ServingFlags.of(
    chat_template="{{ messages[0].content }}",
    default_chat_template_kwargs={"enable_thinking": False},
    enable_auto_tool_choice=True,
    tool_call_parser="hermes",
    reasoning_parser="deepseek_r1",
    exclude_tools_when_tool_choice_none=True,
    tool_strict_level="function",
    enforce_strict_tool_calling=False,
    max_logprobs=-1,
)


def test_default_flags_leave_the_commitment_as_it_was(tmp_path: Path) -> None:
    c = commit(make_model_dir(tmp_path / "m"))
    assert c.serving == VLLM_DEFAULTS
    assert "serving" not in json.loads(c.to_json())
    # A file written before the flags existed loads with vLLM's defaults and its id.
    assert parse_commitment(c.to_json()).commitment_id == c.commitment_id


def test_flags_round_trip_and_change_the_id(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m")
    plain, tools = commit(model), commit(model, serving=TOOLS)
    assert tools.commitment_id != plain.commitment_id
    assert tools.weights_id == plain.weights_id
    entry = json.loads(tools.to_json())["serving"]
    assert entry == {
        "chat_template": "{{ messages[0].content }}",
        "default_chat_template_kwargs": {"enable_thinking": False},
        "enable_auto_tool_choice": True,
        "tool_call_parser": "hermes",
        "reasoning_parser": "deepseek_r1",
        "exclude_tools_when_tool_choice_none": True,
        "tool_strict_level": "function",
        "enforce_strict_tool_calling": False,
        "max_logprobs": -1,
    }
    assert parse_commitment(tools.to_json()) == tools
    assert TOOLS.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"tool_call_parser": 3}, "serving.tool_call_parser"),
        ({"colour": "blue"}, "unknown flags"),
        ({"enable_auto_tool_choice": True}, "needs a tool_call_parser"),
        ({"chat_template_content_format": "xml"}, "chat_template_content_format"),
        ({"reasoning_parser": ""}, "must not be empty"),
        ({"tool_strict_level": "strict"}, "tool_strict_level must be one of"),
        ({"enforce_strict_tool_calling": "0"}, "serving.enforce_strict_tool_calling"),
        ({"max_logprobs": -2}, "max_logprobs must be -1 or more"),
        ({"max_logprobs": True}, "serving.max_logprobs"),
        ({"max_logprobs": 2.5}, "serving.max_logprobs"),
        ([], "must be a JSON object"),
    ],
)
def test_bad_serving_entries_are_refused(tmp_path: Path, entry: object, message: str) -> None:
    body = json.loads(commit(make_model_dir(tmp_path / "m")).to_json())
    del body["commitment_id"]
    body["serving"] = entry
    with pytest.raises(CommitmentError, match=message):
        parse_commitment(json.dumps(body))


def test_kwargs_must_be_an_object() -> None:
    with pytest.raises(ServingFlagsError, match="JSON object"):
        ServingFlags(default_chat_template_kwargs="[1]")
    with pytest.raises(ServingFlagsError, match="not JSON"):
        ServingFlags(default_chat_template_kwargs="{")


def test_the_commit_command_takes_vllm_s_flags(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m")
    template = tmp_path / "tools.jinja"
    template.write_text("{{ messages[0].content }}", encoding="utf-8")
    out = tmp_path / "c.json"
    argv = ["commit", str(model), "--served-name", "tiny", "-o", str(out)]
    argv += ["--chat-template", str(template), "--enable-auto-tool-choice"]
    argv += ["--tool-call-parser", "hermes", "--reasoning-parser", "deepseek_r1"]
    argv += ["--default-chat-template-kwargs", '{"enable_thinking": false}']
    argv += ["--exclude-tools-when-tool-choice-none", "--tool-strict-level", "function"]
    argv += ["--no-enforce-strict-tool-calling", "--max-logprobs", "-1"]
    assert cli_main(argv) == 0
    assert load_commitment(out).serving == TOOLS
    bad = ["commit", str(model), "-o", str(out), "--enable-auto-tool-choice"]
    assert cli_main(bad) == 2


@settings(deadline=None, max_examples=200)
@given(
    st.one_of(
        st.dictionaries(st.sampled_from(sorted(VLLM_DEFAULTS.__dict__)), st.from_type(object)),
        st.recursive(
            st.none() | st.booleans() | st.text(max_size=20),
            lambda inner: st.lists(inner) | st.dictionaries(st.text(max_size=8), inner),
            max_leaves=20,
        ),
    )
)
def test_any_serving_entry_loads_or_is_refused_cleanly(entry: object) -> None:
    with cpu_bound(budget(len(repr(entry)))):
        try:
            flags = ServingFlags.from_json(entry)
        except ServingFlagsError:
            return
    assert ServingFlags.from_json(flags.to_json()) == flags


def test_the_most_a_position_lists_follows_max_logprobs() -> None:
    assert VLLM_DEFAULTS.most_listed == 21
    assert ServingFlags(max_logprobs=0).most_listed == 1
    assert ServingFlags(max_logprobs=-1).most_listed is None
