"""Sampler profiles by name, as commitments name them."""

from __future__ import annotations

from verifierd.samplers.greedy import Greedy
from verifierd.samplers.profile import SamplerProfile, UnknownProfileError
from verifierd.samplers.vllm_cpu_splitmix import VllmCpuSplitmix
from verifierd.samplers.vllm_v1_exponential import VllmV1Exponential, VllmV1ExponentialFp64
from verifierd.samplers.vllm_v2_hash import VllmV2Hash, VllmV2HashFp64

_PROFILES: dict[str, SamplerProfile] = {
    p.name: p
    for p in (
        VllmCpuSplitmix(),
        VllmV1Exponential(),
        VllmV1ExponentialFp64(),
        VllmV2Hash(),
        VllmV2HashFp64(),
        Greedy(),
    )
}

#: Every registered profile name, sorted.
PROFILE_NAMES: tuple[str, ...] = tuple(sorted(_PROFILES))


def get_profile(name: str) -> SamplerProfile:
    """The profile registered as ``name``; UnknownProfileError otherwise."""
    try:
        return _PROFILES[name]
    except KeyError:
        raise UnknownProfileError(
            f"unknown sampler profile {name!r} (known: {', '.join(PROFILE_NAMES)})"
        ) from None
