"""Build info, process and platform series on a daemon's registry."""

from __future__ import annotations

import importlib.metadata
import platform
import time

from prometheus_client import CollectorRegistry
from veritap.runtime_metrics import register_runtime_metrics


def test_build_info_names_the_daemon_and_the_installed_version() -> None:
    registry = CollectorRegistry()
    register_runtime_metrics(registry, "collector")
    labels = {
        "daemon": "collector",
        "version": importlib.metadata.version("veritap"),
        "python": platform.python_version(),
    }
    assert registry.get_sample_value("veritap_build_info", labels) == 1


def test_the_process_and_platform_collectors_report_this_process() -> None:
    registry = CollectorRegistry()
    register_runtime_metrics(registry, "verifierd")
    rss = registry.get_sample_value("process_resident_memory_bytes")
    assert rss is not None and rss > 1 << 20
    fds = registry.get_sample_value("process_open_fds")
    assert fds is not None and fds >= 3  # stdin, stdout, stderr at least
    cpu = registry.get_sample_value("process_cpu_seconds_total")
    assert cpu is not None and 0 < cpu <= time.process_time() + 1
    start = registry.get_sample_value("process_start_time_seconds")
    assert start is not None and start > 1e9
    info = {"implementation": platform.python_implementation()}
    python = platform.python_version_tuple()
    labels = {**info, "major": python[0], "minor": python[1], "patchlevel": python[2]}
    labels["version"] = platform.python_version()
    assert registry.get_sample_value("python_info", labels) == 1
