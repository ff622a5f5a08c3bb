"""The demo's look at both daemons' Prometheus /metrics, as a scraper would see them."""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class MetricsSnapshot:
    #: veritap_collector_records_total summed over capture qualities.
    collector_records: float
    #: veritap_verifier_verdicts_total by status ("pass", "fail", ...), summed over commitments.
    verifier_verdicts: dict[str, float]


def counter_totals(url: str, name: str, label: str | None = None) -> dict[str, float]:
    """Samples `name` of the exposition at `url`, summed by the value of `label` (or all
    under "")."""
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                key = sample.labels.get(label, "") if label else ""
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def scrape(collector_url: str, verifier_url: str, *, verdicts: int) -> MetricsSnapshot:
    """Both daemons' counters, scraped again (a few times at most) until verifierd has
    counted `verdicts` verdicts: its counter moves just after a verdict is stored."""
    for _ in range(10):
        by_status = counter_totals(verifier_url, "veritap_verifier_verdicts_total", "status")
        if sum(by_status.values()) >= verdicts:
            break
        time.sleep(0.5)
    records = counter_totals(collector_url, "veritap_collector_records_total")
    return MetricsSnapshot(sum(records.values()), by_status)
