"""`collector check-config --config collector.toml`: validate, print the effective config."""

from __future__ import annotations

import argparse

from appliance.check_config import DaemonConfig, register_check_config
from collector.config import CollectorDocument, load_document


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    register_check_config(subparsers, DaemonConfig("collector", CollectorDocument, load_document))
