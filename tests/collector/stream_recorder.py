"""A StreamHandler that records what the reassembler emits, for tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from collector.tcp_reassembly import FlowInfo, StreamAmbiguity


@dataclass
class StreamRecorder:
    info: FlowInfo
    events: list[tuple[object, ...]] = field(default_factory=list)
    data: list[bytearray] = field(default_factory=lambda: [bytearray(), bytearray()])
    closed: str | None = None
    ambiguities: list[StreamAmbiguity] = field(default_factory=list)

    def on_start(self, direction: int, midstream: bool, ts_ns: int) -> None:
        self.events.append(("start", direction, midstream))

    def on_data(self, direction: int, data: bytes, ts_ns: int) -> None:
        self.data[direction] += data
        self.events.append(("data", direction, len(data)))

    def on_gap(self, direction: int, length: int, ts_ns: int) -> None:
        self.events.append(("gap", direction, length))

    def on_ambiguous(self, ambiguity: StreamAmbiguity, ts_ns: int) -> None:
        self.ambiguities.append(ambiguity)
        self.events.append(("ambiguous", ambiguity.direction, ambiguity.start, ambiguity.end))

    def on_end(self, direction: int, reason: str, ts_ns: int) -> None:
        self.events.append(("end", direction, reason))

    def on_close(self, reason: str, ts_ns: int) -> None:
        self.closed = reason
        self.events.append(("close", reason))

    def gaps(self, direction: int) -> list[int]:
        return [int(str(e[2])) for e in self.events if e[0] == "gap" and e[1] == direction]


class Recorders:
    """Factory collecting one recorder per flow."""

    def __init__(self) -> None:
        self.flows: list[StreamRecorder] = []

    def __call__(self, info: FlowInfo) -> StreamRecorder:
        recorder = StreamRecorder(info)
        self.flows.append(recorder)
        return recorder
