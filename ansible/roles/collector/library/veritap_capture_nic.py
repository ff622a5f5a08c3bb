#!/usr/bin/python
"""Ansible module: put a capture interface into the state the collector needs, now.

Up and promiscuous (a mirror port delivers frames addressed to other MACs), and
the offloads that merge or split segments off, so the collector sees frames as
they were on the wire. Reads the current state first (/sys flags, ``ethtool
-k``) and changes only what differs, so a second run reports no change. A
feature the driver does not offer is skipped; one fixed "on" is reported in
``fixed_on`` (the collector copes: appliance/CAPTURE.md). The boot-time counterpart is
veritap-capture-nic@.service.
"""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: veritap_capture_nic
short_description: Promiscuous mode on and GRO/LRO/TSO/GSO off for a capture interface
options:
  interface:
    type: str
    required: true
  offloads:
    description: ethtool -K feature names to turn off.
    type: list
    elements: str
    default: [gro, lro, rx-gro-hw, tso, gso]
"""

IFF_UP = 0x1
IFF_PROMISC = 0x100

#: ethtool -K short names and the names ethtool -k prints.
LONG_NAMES = {
    "gro": "generic-receive-offload",
    "lro": "large-receive-offload",
    "tso": "tcp-segmentation-offload",
    "gso": "generic-segmentation-offload",
    "rx-gro-hw": "rx-gro-hw",
    "rx-gro-list": "rx-gro-list",
}


def parse_features(text: str) -> dict[str, tuple[bool, bool]]:
    """``ethtool -k`` output to {feature: (on, fixed)}; indented sub-features included."""
    features: dict[str, tuple[bool, bool]] = {}
    for line in text.splitlines():
        name, sep, rest = line.strip().partition(": ")
        if not sep:
            continue
        words = rest.split()
        if words and words[0] in ("on", "off"):
            features[name] = (words[0] == "on", "[fixed]" in words[1:])
    return features


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "interface": {"type": "str", "required": True},
            "offloads": {
                "type": "list",
                "elements": "str",
                "default": ["gro", "lro", "rx-gro-hw", "tso", "gso"],
            },
        },
        supports_check_mode=True,
    )
    iface: str = module.params["interface"]
    flags_path = f"/sys/class/net/{iface}/flags"
    if "/" in iface or not os.path.exists(flags_path):
        module.fail_json(msg=f"no network interface {iface!r}")
    ip = module.get_bin_path("ip", required=True)
    ethtool = module.get_bin_path("ethtool", required=True)

    changes: list[str] = []
    with open(flags_path, encoding="ascii") as handle:
        flags = int(handle.read().strip(), 16)
    if flags & (IFF_UP | IFF_PROMISC) != IFF_UP | IFF_PROMISC:
        changes.append("up promisc on")
        if not module.check_mode:
            module.run_command(
                [ip, "link", "set", "dev", iface, "up", "promisc", "on"], check_rc=True
            )

    _, out, _ = module.run_command([ethtool, "-k", iface], check_rc=True)
    features = parse_features(out)
    fixed_on: list[str] = []
    for short in module.params["offloads"]:
        state = features.get(LONG_NAMES.get(short, short))
        if state is None or not state[0]:
            continue
        if state[1]:
            fixed_on.append(short)
            continue
        changes.append(f"{short} off")
        if not module.check_mode:
            module.run_command([ethtool, "-K", iface, short, "off"], check_rc=True)
    module.exit_json(changed=bool(changes), changes=changes, fixed_on=fixed_on)


if __name__ == "__main__":
    main()
