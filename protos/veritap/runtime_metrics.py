"""The series every veritap daemon exports beside its own: build info and the process.

`register_runtime_metrics(registry, daemon)` adds to a daemon's registry what node_exporter
and Prometheus' own servers export: `veritap_build_info{daemon, version, python}` (always 1,
so `* on(instance) group_left(version)` puts the version on any series), prometheus-client's
process collector (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
`process_open_fds`, `process_start_time_seconds`, ...: from /proc, Linux only) and its platform
collector (`python_info`).
"""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Gauge, PlatformCollector, ProcessCollector

from veritap.version import package_version


def register_runtime_metrics(registry: CollectorRegistry, daemon: str) -> None:
    """Add build info, process and platform metrics of this process to `registry`."""
    build_info = Gauge(
        "veritap_build_info",
        "Always 1; the labels say which veritap daemon and version this is.",
        ["daemon", "version", "python"],
        registry=registry,
    )
    build_info.labels(
        daemon=daemon, version=package_version(), python=platform.python_version()
    ).set(1)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
