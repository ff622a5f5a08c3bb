"""Noise streams kept across the scoring passes of one response.

Verifying from the text alone scores a response in several passes, each from a
later output position (verifierd.evidence.search). A stateful noise stream
(vllm-v1-exponential: one vocabulary-wide Exp(1) row per position, drawn from the
request's generator) must draw every row before a pass's first position, so a
fresh stream per pass redraws the whole prefix each time: on a GPU a pass from
output position 300 draws 300 rows it discards. The cache keeps, per response
(profile, seed, prompt length, width, device), a copy of the stream at the
position where its latest pass began; the next pass resumes from there. A pass
that begins before that position gets a fresh stream, so the noise is always
exactly a fresh stream's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import torch

from verifierd.difr import SamplingSettings, open_stream
from verifierd.samplers import NoiseStream, SamplerProfile

#: Responses whose streams are kept (a CPU generator's state is ~5 KB).
DEFAULT_MAX_STREAMS = 1024


class StreamCache:
    """Bounded: the least recently opened responses' streams go first."""

    def __init__(self, max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        self._max = max_streams
        self._streams: OrderedDict[Hashable, NoiseStream] = OrderedDict()

    def __len__(self) -> int:
        return len(self._streams)

    def open_at(
        self,
        sampling: SamplingSettings,
        profile: SamplerProfile,
        prompt_len: int,
        width: int,
        device: torch.device,
        *,
        start: int,
    ) -> NoiseStream | None:
        """`open_stream` skipped to output position ``start`` (None for greedy
        ``sampling``, which must be `SamplingSettings.effective`)."""
        if sampling.is_greedy:
            return None
        key = (profile.name, sampling.seed, prompt_len, width, str(device))
        cached = self._streams.pop(key, None)
        stream = None if cached is None else cached.resumed(start)
        if stream is None:
            stream = open_stream(sampling, profile, prompt_len, width, device)
            if stream is None:
                return None
            stream.skip(start)
        kept = stream.resumed(start)
        if kept is not None:
            self._streams[key] = kept
            while len(self._streams) > self._max:
                self._streams.popitem(last=False)
        return stream
