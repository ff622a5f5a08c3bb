"""A stand-in engine backend for fast tests of the engine pool's process protocol.

It runs in the same child process the real vLLM backend runs in, speaks the same
interface (load, version, logits_width, check_request, score, close) and lets a
test steer it through the request ids and model path:

- model directory named ``broken*``: loading raises;
- model directory named ``slow*``: loading takes a minute (for load timeouts);
- request id containing ``reject``: check_request refuses it;
- request id containing ``crash``: the process exits mid-batch (os._exit);
- request id containing ``fail``: score raises;
- ``VERITAP_FAKE_BATCH_S`` in the environment: seconds each batch takes.

Margins: 0 for every output token, except token ids >= 1000, which score 1.0
(a "dishonest" token). A request without output ids is scored on the code points
of its evidence's text, as if each character were a token. The real backend's
tests live beside these.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np

from verifierd.difr import DifrResult
from verifierd.engine.backend import EngineSpec, ScoreRequest, ScoreResult

FACTORY = "tests.verifierd.engine_doubles:FakeBackend.load"


class FakeBackend:
    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.version = "fake 1.0"
        self.logits_width = 4096

    @classmethod
    def load(cls, spec: EngineSpec) -> FakeBackend:
        if spec.model_dir.name.startswith("broken"):
            raise RuntimeError("cannot load a broken model")
        if spec.model_dir.name.startswith("slow"):
            time.sleep(60)
        return cls(spec)

    def check_request(self, request: ScoreRequest, profile_name: str) -> str | None:
        return "refused by request id" if "reject" in request.request_id else None

    def score(
        self, requests: Sequence[ScoreRequest], profile_name: str, delta_max: float
    ) -> list[ScoreResult]:
        time.sleep(float(os.environ.get("VERITAP_FAKE_BATCH_S", "0")))
        out = []
        for r in requests:
            if "crash" in r.request_id:
                os._exit(17)
            if "fail" in r.request_id:
                raise RuntimeError("the engine failed this batch")
            output = r.output_token_ids
            if not output and r.evidence is not None:
                output = tuple(ord(c) for c in r.evidence.text)
            raw = np.array([1.0 if t >= 1000 else 0.0 for t in output])
            out.append(
                ScoreResult(
                    r.request_id,
                    DifrResult.from_raw_margins(raw, delta_max),
                    1000,
                    10,
                    5,
                    prompt_tokens=len(r.prompt_token_ids),
                    output_tokens=len(output),
                )
            )
        return out

    def close(self) -> None:
        pass
