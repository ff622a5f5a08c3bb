"""The provers' Prometheus gauges, from real prover tables."""

from __future__ import annotations

from tests.verifierd.provers.conftest import Provers
from tests.verifierd.provers.prover_fixtures import CHEAT, HONEST, dishonest, honest, unverifiable
from verifierd.metrics import VerifierMetrics

HOUR = 3600 * 1_000_000_000


def test_alarm_state_unverifiable_share_and_evidence_per_prover(provers: Provers) -> None:
    tables, now = provers.tables, provers.clock.now
    provers.traffic.send(HONEST, [honest(100, now)] * 3 + [unverifiable("no_seed", now)])
    provers.traffic.send(CHEAT, [dishonest(50, now)] * 10)
    metrics = VerifierMetrics()

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    metrics.set_provers(tables.provers(), 3600)
    cheat, fair = "edge/[fd00::2]:8000", "edge/10.0.0.1:8000"
    assert sample("veritap_prover_alarm", prover=cheat, kind="dishonest") == 1
    assert sample("veritap_prover_alarm", prover=cheat, kind="hiding") == 0
    assert sample("veritap_prover_alarm", prover=fair, kind="dishonest") == 0
    assert sample("veritap_prover_unverifiable_ratio", prover=fair, reason="no_seed") == 0.25
    evidence = sample("veritap_prover_evidence", prover=cheat)
    assert evidence is not None and evidence > 13  # ln(1e6)
    honest_evidence = sample("veritap_prover_evidence", prover=fair)
    assert honest_evidence is not None and honest_evidence < 0

    [state] = tables.alarms()
    tables.clear_alarm(state.alarm.alarm_id, actor="CN=ops-admin", why="redeployed")
    provers.clock.now += 2 * HOUR  # the no_seed verdict left the hour
    metrics.set_provers(tables.provers(), 3600)
    assert sample("veritap_prover_alarm", prover=cheat, kind="dishonest") == 0
    assert sample("veritap_prover_unverifiable_ratio", prover=fair, reason="no_seed") is None
    assert sample("veritap_prover_evidence", prover=cheat) == 0
