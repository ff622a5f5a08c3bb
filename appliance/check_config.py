"""`check-config`, the same subcommand for both daemons (as `suricata -T`, `promtool check`).

``DAEMON check-config --config FILE`` validates the file exactly as `run` reads it and
prints the effective configuration (every default filled in) as JSON on stdout; a bad file
prints every problem, one per line under its TOML path, on stderr and exits `EXIT_CONFIG`.
The playbook runs it as the `validate:` command of the rendered config, so a bad template
never replaces a working file. ``--schema`` prints the file's JSON Schema instead, which
``make config-schema`` commits under appliance/config/ for editors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veritap.config_schema import ConfigError, dump_document, json_schema

from appliance.command_line import EXIT_CONFIG


@dataclass(frozen=True)
class DaemonConfig:
    """What `check-config` needs to know of a daemon's config file."""

    #: The daemon's name: the program and the schema's title.
    daemon: str
    #: The section class of the whole file (a `veritap.config_schema` dataclass).
    document: type[Any]
    #: Reads and validates a file (None: the defaults); ConfigError when it is invalid.
    load: Callable[[Path | None], object]


def register_check_config(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], config: DaemonConfig
) -> None:
    parser = subparsers.add_parser(
        "check-config",
        help="validate a config file and print the effective configuration",
        description=(
            f"Validate a {config.daemon} TOML file as `{config.daemon} run` reads it and print "
            "the effective configuration (defaults filled in) as JSON; on a bad file print "
            f"every problem and exit {EXIT_CONFIG}."
        ),
    )
    parser.add_argument("--config", type=Path, help="the TOML file (default: the defaults)")
    parser.add_argument(
        "--schema", action="store_true", help="print the file format's JSON Schema instead"
    )
    parser.set_defaults(func=lambda args: check_config(config, args.config, schema=args.schema))


def check_config(config: DaemonConfig, path: Path | None, *, schema: bool = False) -> int:
    if schema:
        data = json_schema(config.document, title=f"veritap {config.daemon} configuration")
    else:
        try:
            document = config.load(path)
        except ConfigError as exc:
            where = f" {path}" if path is not None else ""
            sys.stderr.write(f"{config.daemon} check-config:{where}: invalid\n")
            sys.stderr.writelines(f"  {problem}\n" for problem in exc.problems)
            return EXIT_CONFIG
        data = dump_document(config.document, document)
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    return 0
