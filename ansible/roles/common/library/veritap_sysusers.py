#!/usr/bin/python
"""Ansible module: create veritap's service users with systemd-sysusers, report their ids.

The sysusers.d files (appliance/sysusers.d) are the one definition of the users;
this module runs ``systemd-sysusers --root=ROOT FILE...`` only when one of the
users, groups or memberships they declare is missing from ROOT/etc/passwd and
ROOT/etc/group, and returns the numeric ids so the roles can own files by
number (the names need not resolve on the controller or outside ROOT).
"""

from __future__ import annotations

import os
import shlex

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: veritap_sysusers
short_description: Create system users from sysusers.d files and return their uid/gid
options:
  root:
    description: Filesystem root the users are created in ("/" on a real host).
    type: path
    default: /
  files:
    description: sysusers.d files, as paths inside root.
    type: list
    elements: path
    required: true
"""

RETURN = r"""
users:
  description: uid and primary gid of every user the files declare.
  type: dict
groups:
  description: gid of every group the files declare.
  type: dict
missing:
  description: what was missing (and created, unless in check mode).
  type: list
"""


def parse_sysusers(text: str) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """Users, groups and (user, group) memberships declared by a sysusers.d file."""
    users: list[str] = []
    groups: list[str] = []
    members: list[tuple[str, str]] = []
    for line in text.splitlines():
        fields = shlex.split(line, comments=True)
        if not fields:
            continue
        kind = fields[0]
        if kind == "u":
            users.append(fields[1])
            groups.append(fields[1])
        elif kind == "g":
            groups.append(fields[1])
        elif kind == "m":
            members.append((fields[1], fields[2]))
    return users, groups, members


def read_table(path: str) -> list[list[str]]:
    try:
        with open(path, encoding="utf-8") as handle:
            return [line.rstrip("\n").split(":") for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "default": "/"},
            "files": {"type": "list", "elements": "path", "required": True},
        },
        supports_check_mode=True,
    )
    root: str = module.params["root"]
    paths = [inside(root, f) for f in module.params["files"]]
    users: list[str] = []
    groups: list[str] = []
    members: list[tuple[str, str]] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                u, g, m = parse_sysusers(handle.read())
        except OSError as exc:
            module.fail_json(msg=f"cannot read {path}: {exc}")
        users += u
        groups += g
        members += m

    def state() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        passwd = {row[0]: row for row in read_table(inside(root, "etc/passwd")) if len(row) >= 4}
        group = {row[0]: row for row in read_table(inside(root, "etc/group")) if len(row) >= 4}
        return passwd, group

    passwd, group = state()
    missing = [f"user {u}" for u in users if u not in passwd]
    missing += [f"group {g}" for g in groups if g not in group]
    missing += [
        f"member {u} of {g}"
        for u, g in members
        if g not in group or u not in group[g][3].split(",")
    ]
    if missing and not module.check_mode:
        os.makedirs(inside(root, "etc"), exist_ok=True)
        rc, out, err = module.run_command(["systemd-sysusers", f"--root={root}", *paths])
        if rc != 0:
            module.fail_json(msg="systemd-sysusers failed", rc=rc, stdout=out, stderr=err)
        passwd, group = state()
    module.exit_json(
        changed=bool(missing),
        missing=missing,
        users={
            u: {"uid": int(passwd[u][2]), "gid": int(passwd[u][3])} for u in users if u in passwd
        },
        groups={g: int(group[g][2]) for g in groups if g in group},
    )


if __name__ == "__main__":
    main()
