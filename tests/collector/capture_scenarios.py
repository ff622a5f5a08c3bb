"""Chat calls, connections and the one Ethernet capture they are written into, for the
end-to-end `collector replay` tests; the exported records grouped by model."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from tests.openai_traffic import Call, words
from tests.pcapgen import LINK_ETHERNET, Conversation, Packet, frame, write_frames

MESSAGES = [{"role": "user", "content": "hello"}]


def chat(model: str, n_tokens: int = 6, **params: object) -> Call:
    return Call(
        "/v1/chat/completions",
        model,
        MESSAGES,
        {"temperature": 0.7, "seed": 1, "return_token_ids": True, **params},
        [words(n_tokens, seed=len(model))],
        prompt_token_ids=(1, 5, 9),
        response_id=f"chatcmpl-{model}",
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Capture:
    """Conversations collected into one Ethernet capture, each with its own port and VLANs."""

    def __init__(self) -> None:
        self.parts: list[tuple[Conversation, list[Packet], tuple[int, ...]]] = []
        self.port = 42000

    def conversation(self, *, ipv6: bool = False, server_isn: int = 500_000) -> Conversation:
        self.port += 1
        start = 1_700_000_000.0 + len(self.parts) * 0.0003
        if ipv6:
            client, server = ("fd00::10", self.port), ("fd00::20", 8000)
        else:
            client, server = ("10.9.0.1", self.port), ("10.0.0.2", 8000)
        return Conversation(client=client, server=server, ts=start, server_isn=server_isn)

    def add(
        self, conv: Conversation, packets: list[Packet] | None = None, vlans: Sequence[int] = ()
    ) -> None:
        self.parts.append((conv, conv.packets if packets is None else packets, tuple(vlans)))

    def write(self, path: Path) -> Path:
        frames = [
            (p.ts, frame(conv, p, link=LINK_ETHERNET, vlans=vlans))
            for conv, packets, vlans in self.parts
            for p in packets
        ]
        frames.sort(key=lambda f: f[0])
        return write_frames(path, frames)


def by_model(records: list[dict[str, object]]) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for rec in records:
        out.setdefault(str(rec["model"]), []).append(rec)
    return out
