"""`verifierd check-config --config verifierd.toml`: validate, print the effective config."""

from __future__ import annotations

import argparse

from appliance.check_config import DaemonConfig, register_check_config
from verifierd.config import VerifierdDocument, load_document


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    register_check_config(subparsers, DaemonConfig("verifierd", VerifierdDocument, load_document))
