"""The VerifierService's sans-IO parts: page tokens, filters, identities, token pieces,
the throughput window and the verdict fan-out."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from veritap.tls import ServerTls
from veritap.v1 import record_pb2, verifier_pb2

from tests.recorded_traffic import build_tokenizer
from verifierd.api import ServiceSettings
from verifierd.api.errors import PageTokenError
from verifierd.api.identity import ANONYMOUS, AdminPolicy, Principal, principal_of
from verifierd.api.rate_window import RateWindow
from verifierd.api.record_tokens import scored_tokens, token_pieces
from verifierd.api.tokenizer_cache import LoadedTokenizer
from verifierd.api.verdict_hub import SubscriberOverflowError, VerdictHub
from verifierd.api.verdict_query import (
    QueryError,
    VerdictFilter,
    VerdictQuery,
    decode_page_token,
    encode_page_token,
)
from verifierd.config import ServiceConfig, parse_config
from verifierd.store import StoredVerdict

_TOKENIZER: Tokenizer = build_tokenizer()


# -- page tokens ------------------------------------------------------------------------


@given(after=st.binary(min_size=1, max_size=80), fingerprint=st.binary(min_size=8, max_size=8))
def test_page_tokens_round_trip(after: bytes, fingerprint: bytes) -> None:
    token = encode_page_token(after, fingerprint)
    assert token.isascii() and "=" not in token
    assert decode_page_token(token, fingerprint) == after


@given(token=st.text(max_size=60), fingerprint=st.binary(min_size=8, max_size=8))
def test_any_string_decodes_or_is_refused_as_a_page_token(token: str, fingerprint: bytes) -> None:
    try:
        after = decode_page_token(token, fingerprint)
    except PageTokenError:
        return
    assert after
    assert decode_page_token(encode_page_token(after, fingerprint), fingerprint) == after


def test_a_page_token_only_resumes_its_own_query() -> None:
    query = VerdictQuery.of(verifier_pb2.ListVerdictsRequest(statuses=[2], page_size=5))
    token = query.next_token(b"resume-key")
    again = VerdictQuery.of(verifier_pb2.ListVerdictsRequest(statuses=[2], page_token=token))
    assert again.after == b"resume-key"
    assert query.next_token(b"") == ""
    for other in (
        verifier_pb2.ListVerdictsRequest(statuses=[1], page_token=token),
        verifier_pb2.ListVerdictsRequest(statuses=[2], from_ns=1, page_token=token),
        verifier_pb2.ListVerdictsRequest(statuses=[2], min_score=0.0, page_token=token),
    ):
        with pytest.raises(PageTokenError, match="other filters"):
            VerdictQuery.of(other)


def test_page_sizes_are_bounded() -> None:
    assert VerdictQuery.of(verifier_pb2.ListVerdictsRequest()).page_size == 100
    assert VerdictQuery.of(verifier_pb2.ListVerdictsRequest(page_size=10**6)).page_size == 1000


# -- filters ----------------------------------------------------------------------------

verdicts = st.builds(
    verifier_pb2.Verdict,
    commitment_id=st.sampled_from(["", "a" * 64, "b" * 64]),
    model=st.sampled_from(["", "m1", "m2"]),
    status=st.integers(0, 6),
    score=st.floats(allow_nan=False, allow_infinity=False, width=32),
)


@given(
    verdict=verdicts,
    statuses=st.frozensets(st.integers(0, 6), max_size=3),
    bounds=st.tuples(st.none() | st.floats(-5, 5), st.none() | st.floats(-5, 5)),
    names=st.tuples(st.sampled_from(["", "a" * 64]), st.sampled_from(["", "m1"])),
)
def test_a_filter_accepts_exactly_what_each_field_allows(
    verdict: verifier_pb2.Verdict,
    statuses: frozenset[int],
    bounds: tuple[float | None, float | None],
    names: tuple[str, str],
) -> None:
    low, high = bounds
    commitment_id, model = names
    if low is not None and high is not None and low > high:
        with pytest.raises(QueryError):
            VerdictFilter(commitment_id, model, statuses, low, high)
        return
    verdict_filter = VerdictFilter(commitment_id, model, statuses, low, high)
    expected = (
        (not commitment_id or verdict.commitment_id == commitment_id)
        and (not model or verdict.model == model)
        and (not statuses or verdict.status in statuses)
        and (low is None or verdict.score >= low)
        and (high is None or verdict.score <= high)
    )
    assert verdict_filter.accept(verdict) == expected


def test_nan_score_bounds_are_refused() -> None:
    with pytest.raises(QueryError):
        VerdictQuery.of(verifier_pb2.ListVerdictsRequest(min_score=math.nan))


# -- identities -------------------------------------------------------------------------


def test_principals_come_from_a_verified_certificate_only() -> None:
    tls = {
        "transport_security_type": [b"ssl"],
        "x509_subject": [b"CN=ops-admin,O=veritap"],
        "x509_common_name": [b"ops-admin"],
    }
    assert principal_of(tls) == Principal("CN=ops-admin,O=veritap", "ops-admin")
    assert principal_of({"transport_security_type": [b"ssl"]}) == ANONYMOUS
    assert principal_of({"x509_common_name": [b"ops-admin"]}) == ANONYMOUS
    assert principal_of({}).name == "anonymous"


def test_the_admin_role_matches_a_whole_subject_or_a_common_name() -> None:
    admin = Principal("CN=ops-admin,O=veritap", "ops-admin")
    lookalike = Principal("CN=ops-admin,O=elsewhere", "ops-admin")
    assert AdminPolicy.of(["ops-admin"]).allows(admin)
    assert AdminPolicy.of(["ops-admin"]).allows(lookalike)
    assert AdminPolicy.of(["CN=ops-admin,O=veritap"]).allows(admin)
    assert not AdminPolicy.of(["CN=ops-admin,O=veritap"]).allows(lookalike)
    assert not AdminPolicy.of(["ops-operator"]).allows(admin)
    assert not AdminPolicy.of([]).allows(admin)
    assert not AdminPolicy.of(["", " "]).allows(ANONYMOUS)


# -- token pieces -----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_token_pieces_concatenate_to_the_decoded_text(text: str) -> None:
    codec = LoadedTokenizer(_TOKENIZER)
    ids = codec.encode_text(text)
    pieces = token_pieces(codec, ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == codec.decode_ids(ids)


def test_a_character_split_across_tokens_shows_on_the_token_that_completes_it() -> None:
    codec = LoadedTokenizer(_TOKENIZER)
    ids = codec.encode_text("a ✓ b")
    pieces = token_pieces(codec, ids)
    assert "".join(pieces) == "a ✓ b"
    assert " ✓" in pieces or "✓" in pieces
    assert "" in pieces


def test_the_heat_map_follows_the_ids_the_search_found() -> None:
    codec = LoadedTokenizer(_TOKENIZER)
    record = record_pb2.InferenceRecord()
    record.api.choices.add(index=0, text="a ✓ b")
    found = [codec.encode_text("a")[0], *codec.encode_text(" ✓ b")]
    verdict = verifier_pb2.Verdict(choice_index=0, found_token_ids=found)
    tokens = scored_tokens(record, verdict, codec, "")
    assert tokens.ids == tuple(found) and "found" in tokens.note
    assert "".join(tokens.texts) == "a ✓ b"
    retokenized = scored_tokens(record, verifier_pb2.Verdict(choice_index=0), codec, "")
    assert retokenized.ids == tuple(codec.encode_text("a ✓ b"))


# -- throughput window ------------------------------------------------------------------


def test_the_rate_window_counts_only_the_last_window() -> None:
    window = RateWindow(window_ns=10_000_000_000)
    window.add(5, 1_000_000_000)
    window.add(15, 8_000_000_000)
    assert window.per_second(9_000_000_000) == 2.0
    assert window.per_second(11_000_000_000) == 1.5
    assert window.per_second(18_000_000_000) == 0.0
    with pytest.raises(ValueError):
        RateWindow(window_ns=0)


# -- verdict fan-out --------------------------------------------------------------------


def _stored(n: int) -> list[StoredVerdict]:
    return [
        StoredVerdict(
            "o", i, verifier_pb2.SignedVerdict(), verifier_pb2.Verdict(record_id=f"r{i}", seq=i)
        )
        for i in range(n)
    ]


async def test_the_hub_delivers_batches_from_other_threads_in_order() -> None:
    hub = VerdictHub(limit=100)
    subscription = hub.subscribe()
    await asyncio.to_thread(hub.publish, _stored(3))
    await asyncio.to_thread(hub.publish, _stored(2))
    got = []
    async for verdict in subscription.verdicts():
        got.append(verdict.record_id)
        if len(got) == 5:
            break
    assert got == ["r0", "r1", "r2", "r0", "r1"]
    subscription.close()
    assert hub.subscribers == 0


async def test_a_subscriber_that_falls_behind_is_told_not_silently_skipped() -> None:
    hub = VerdictHub(limit=4)
    slow = hub.subscribe()
    hub.publish(_stored(3))
    hub.publish(_stored(3))
    await asyncio.sleep(0)
    with pytest.raises(SubscriberOverflowError):
        async for _ in slow.verdicts():
            pass
    hub.close()
    assert hub.subscribers == 0


def test_service_settings_come_from_the_service_table(tmp_path: Path) -> None:
    plain = ServiceSettings.from_config(ServiceConfig())
    assert (plain.listen, plain.tls, plain.admin_subjects) == ("127.0.0.1:50061", None, frozenset())
    config = parse_config(
        {
            "service": {
                "listen": "0.0.0.0:50061",
                "ca_file": "pki/clients.pem",
                "cert_file": "pki/server.pem",
                "key_file": "pki/server.key",
                "admin_subjects": ["CN=ops-admin,O=veritap", "break-glass"],
            }
        },
        tmp_path,
    )
    settings = ServiceSettings.from_config(config.service)
    assert settings.tls == ServerTls(
        tmp_path / "pki/server.pem", tmp_path / "pki/server.key", tmp_path / "pki/clients.pem"
    )
    assert settings.admin_subjects == {"CN=ops-admin,O=veritap", "break-glass"}
