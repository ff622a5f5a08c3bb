"""The NVML samplers, driven by recorded call sequences; the real NVML where a GPU is present."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.verifierd.gpm_simulation import Phase, S, SimulatedGpmGpus, profile_integral
from verifierd.meter.cpu import CpuSampler
from verifierd.meter.errors import MeterUnavailableError, ReplayMismatchError
from verifierd.meter.nvml_gpm import (
    DRAM_BW_UTIL,
    METRIC_IDS,
    GpmSampler,
    PynvmlGpmApi,
    RecordingGpmApi,
    ReplayGpmApi,
)
from verifierd.meter.nvml_recording import CallRecorder, CallScript, RecordedCall
from verifierd.meter.nvml_utilization import (
    PynvmlUtilizationApi,
    ReplayUtilizationApi,
    UtilizationSampler,
)
from verifierd.meter.readings import Method, Reading
from verifierd.meter.sampling import Meter
from verifierd.meter.selection import MeterSettings, open_sampler

T0 = 1_763_000_000 * S  # a wall-clock start, in ns

# A decode-heavy stretch (low tensor activity, high DRAM) then a prefill burst, then idle.
PROFILE = [
    Phase(0.5, tensor=0.0, sm=0.0, dram=0.0),
    Phase(2.0, tensor=0.12, sm=0.55, dram=0.70),
    Phase(1.0, tensor=0.85, sm=0.97, dram=0.35),
    Phase(0.5, tensor=0.0, sm=0.0, dram=0.0),
]

# Recorded from one GPU, hand-checked: first sample, two good intervals (DRAM metric not
# supported on this GPU: nvmlReturn 3), a sample taken 50 ms after the previous one (too close
# for GPM: no metrics asked), a failed sample (GPU_IS_LOST, 15) that breaks the chain, then a
# fresh start. metric_ids "5,2,10" = ANY_TENSOR_UTIL, SM_UTIL, DRAM_BW_UTIL.
RECORDED = """
{"args": {}, "call": "device_count", "result": 1}
{"args": {"gpu": 0}, "call": "is_supported", "result": true}
{"args": {"gpu": 0, "slot": 0}, "call": "take_sample", "result": 1763000000000000000}
{"args": {"gpu": 0, "slot": 1}, "call": "take_sample", "result": 1763000000100412000}
{"args": {"earlier": 0, "gpu": 0, "later": 1, "metric_ids": "5,2,10"}, "call": "metrics", "result": [[5, 0, 41.5], [2, 0, 88.25], [10, 3, 0.0]]}
{"args": {"gpu": 0, "slot": 0}, "call": "take_sample", "result": 1763000000200950000}
{"args": {"earlier": 1, "gpu": 0, "later": 0, "metric_ids": "5,2,10"}, "call": "metrics", "result": [[5, 0, 63.0], [2, 0, 91.0], [10, 3, 0.0]]}
{"args": {"gpu": 0, "slot": 1}, "call": "take_sample", "result": 1763000000250950000}
{"args": {"gpu": 0, "slot": 1}, "call": "take_sample", "result": 1763000000301200000}
{"args": {"earlier": 0, "gpu": 0, "later": 1, "metric_ids": "5,2,10"}, "call": "metrics", "result": [[5, 0, 100.7], [2, 0, 99.0], [10, 3, 0.0]]}
{"args": {"gpu": 0, "slot": 0}, "call": "take_sample", "error": {"code": 15, "message": "GPU is lost"}}
{"args": {"gpu": 0, "slot": 0}, "call": "take_sample", "result": 1763000000600000000}
{"args": {"gpu": 0, "slot": 1}, "call": "take_sample", "result": 1763000000700000000}
{"args": {"earlier": 0, "gpu": 0, "later": 1, "metric_ids": "5,2,10"}, "call": "metrics", "result": [[5, 0, 0.0], [2, 0, 0.0], [10, 3, 0.0]]}
"""  # noqa: E501


def replay(text: str) -> ReplayGpmApi:
    return ReplayGpmApi(CallScript.from_lines(text.splitlines()))


def drain(sampler: GpmSampler | UtilizationSampler, reads: int) -> list[Reading]:
    out: list[Reading] = []
    for _ in range(reads):
        out.extend(sampler.read())
    return out


def test_recorded_sequence_gives_the_expected_readings() -> None:
    api = replay(RECORDED)
    sampler = GpmSampler(api)
    readings = drain(sampler, 8)
    assert [(r.start_ns - T0, r.end_ns - T0) for r in readings] == [
        (0, 100_412_000),
        (100_412_000, 200_950_000),
        # The 50 ms sample was skipped: this interval runs from the 200 ms sample.
        (200_950_000, 301_200_000),
        (600_000_000, 700_000_000),
    ]
    assert [r.activity for r in readings] == [0.415, 0.63, 1.0, 0.0]  # 100.7 % clamps to 1
    assert [r.sm for r in readings] == [0.8825, 0.91, 0.99, 0.0]
    assert all(r.dram is None for r in readings)
    assert all(r.target == "gpu0" for r in readings)
    sampler.close()
    assert api.closed


def test_replay_refuses_a_call_that_was_not_recorded() -> None:
    with pytest.raises(ReplayMismatchError, match=r"expected take_sample.*got is_supported"):
        GpmSampler(replay(RECORDED), gpus=[0, 0]).read()
    sampler = GpmSampler(replay(RECORDED))
    drain(sampler, 8)
    with pytest.raises(ReplayMismatchError, match="after the recording ended"):
        sampler.read()


def test_gpu_without_gpm_or_absent_is_unavailable() -> None:
    no_gpm = '{"args": {}, "call": "device_count", "result": 2}\n' + (
        '{"args": {"gpu": 0}, "call": "is_supported", "result": true}\n'
        '{"args": {"gpu": 1}, "call": "is_supported", "result": false}\n'
    )
    with pytest.raises(MeterUnavailableError, match=r"GPM not supported on GPU\(s\) \[1\]"):
        GpmSampler(replay(no_gpm))
    with pytest.raises(MeterUnavailableError, match="not present"):
        GpmSampler(replay(no_gpm), gpus=[3])
    with pytest.raises(MeterUnavailableError, match="no GPU"):
        GpmSampler(replay('{"args": {}, "call": "device_count", "result": 0}'))


def record_simulation(tmp_path: Path, reads: int, **kwargs: object) -> Path:
    recorder = CallRecorder()
    sampler = GpmSampler(RecordingGpmApi(SimulatedGpmGpus(PROFILE, T0, **kwargs), recorder))  # type: ignore[arg-type]
    drain(sampler, reads)
    path = tmp_path / "gpm.jsonl"
    recorder.dump(path)
    return path


def test_a_recorded_run_replays_to_the_known_integral(tmp_path: Path) -> None:
    # 4 s of profile at 10 Hz with +-3 ms jitter, on two GPUs.
    path = record_simulation(tmp_path, reads=41, gpus=2, jitter_ns=3_000_000, seed=7)
    recorded = [RecordedCall.from_json(line) for line in path.read_text().splitlines()]
    metrics = [c for c in recorded if c.call == "metrics"]
    assert {c.args["gpu"] for c in metrics} == {0, 1}
    for call in metrics:
        assert isinstance(call.result, list)
        assert [row[0] for row in call.result] == [5, 2, 10]  # type: ignore[index]
        assert all(row[1] == 0 and 0 <= row[2] <= 100 for row in call.result)  # type: ignore[index,operator]
    sampler = GpmSampler(ReplayGpmApi(CallScript.load(path)))
    meter = Meter(sampler)
    for _ in range(41):
        meter.tick()
    end = meter.ring.latest_end("gpu0")
    assert end is not None
    # Integrate over whole readings: the step rule is then exact for counter-based metrics.
    cost = meter.cost(T0, end, meter.targets_for(gpus=[0, 1]))
    expected = 2 * profile_integral(PROFILE, 0, (end - T0) / S)
    assert cost.method is Method.NVML_GPM
    assert cost.activity_seconds == pytest.approx(expected, rel=1e-6)
    assert cost.sm_seconds is not None and cost.sm_seconds > cost.activity_seconds
    assert cost.coverage == pytest.approx(1.0, abs=0.01)


def test_a_batch_window_inside_the_run_is_close_to_the_profile(tmp_path: Path) -> None:
    path = record_simulation(tmp_path, reads=41, jitter_ns=2_000_000, seed=3)
    meter = Meter(GpmSampler(ReplayGpmApi(CallScript.load(path))))
    for _ in range(41):
        meter.tick()
    # The prefill burst: 2.5 s .. 3.5 s. Edges cut readings: error at most 2 x 0.1 s x 0.85.
    cost = meter.cost(T0 + 2_500_000_000, T0 + 3_500_000_000, ("gpu0",))
    assert cost.activity_seconds == pytest.approx(0.85, abs=0.17)
    assert cost.dram_seconds == pytest.approx(0.35, abs=0.14)


def test_recording_and_replay_round_trip(tmp_path: Path) -> None:
    path = record_simulation(tmp_path, reads=10, unsupported_metrics=[DRAM_BW_UTIL])
    first = drain(GpmSampler(ReplayGpmApi(CallScript.load(path))), 10)
    again = CallRecorder()
    drain(GpmSampler(RecordingGpmApi(ReplayGpmApi(CallScript.load(path)), again)), 10)
    assert again.lines() == path.read_text().splitlines()
    assert len(first) == 9 and all(r.dram is None for r in first)
    assert METRIC_IDS == (5, 2, 10)


UTILIZATION = """
{"args": {}, "call": "device_count", "result": 1}
{"args": {"gpu": 0}, "call": "utilization", "result": [1763000000000000000, 0, 1]}
{"args": {"gpu": 0}, "call": "utilization", "result": [1763000000100000000, 100, 38]}
{"args": {"gpu": 0}, "call": "utilization", "error": {"code": 999, "message": "Unknown Error"}}
{"args": {"gpu": 0}, "call": "utilization", "result": [1763000000300000000, 97, 40]}
{"args": {"gpu": 0}, "call": "utilization", "result": [1763000000400000000, 50, 20]}
"""


def test_utilization_fallback_from_a_recording() -> None:
    api = ReplayUtilizationApi(CallScript.from_lines(UTILIZATION.splitlines()))
    sampler = UtilizationSampler(api)
    readings = drain(sampler, 5)
    assert sampler.method is Method.NVML_UTILIZATION
    # The failed read breaks the chain: no interval spans it.
    assert [(r.start_ns - T0, r.end_ns - T0, r.activity, r.dram) for r in readings] == [
        (0, 100_000_000, 1.0, 0.38),
        (300_000_000, 400_000_000, 0.5, 0.2),
    ]


def nvml_or_skip() -> PynvmlGpmApi:
    try:
        return PynvmlGpmApi()
    except MeterUnavailableError as exc:
        pytest.skip(f"no NVML on this host: {exc}")


def test_auto_falls_back_to_cpu_seconds_without_nvml() -> None:
    try:
        PynvmlGpmApi().close()
    except MeterUnavailableError:
        pass
    else:
        pytest.skip("NVML is present: the fallback to CPU-seconds does not apply")
    sampler, skipped = open_sampler(MeterSettings())
    assert isinstance(sampler, CpuSampler)
    assert [reason.split(":")[0] for reason in skipped] == ["nvml-gpm", "nvml-utilization"]
    assert all("NVML unavailable" in reason for reason in skipped)
    with pytest.raises(MeterUnavailableError):
        open_sampler(MeterSettings(method="nvml-gpm"))


@pytest.mark.gpu
def test_real_gpm_sees_tensor_work() -> None:
    api = nvml_or_skip()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        api.close()
        pytest.skip("NVML loads but torch sees no CUDA device")
    try:
        sampler = GpmSampler(api, gpus=[torch.cuda.current_device()])
    except MeterUnavailableError as exc:
        api.close()
        pytest.skip(f"GPM unavailable here: {exc}")
    meter = Meter(sampler)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = a @ a  # cuBLAS initialised before the window opens
    torch.cuda.synchronize()
    with meter:
        time.sleep(0.5)  # two samples in hand, so readings cover the whole window
        start = time.time_ns()
        for _ in range(1500):  # about 2 s of dense bf16 products on an H100/H200
            b = a @ a
        torch.cuda.synchronize()
        end = time.time_ns()
        cost = meter.cost(start, end, meter.targets())
    assert b.shape == a.shape
    assert cost.coverage > 0.8
    # 400 products of 8192^3 keep the tensor pipes busy for most of the window.
    assert cost.activity_seconds / cost.window_seconds > 0.3


@pytest.mark.gpu
def test_real_utilization_fallback_reads() -> None:
    try:
        api = PynvmlUtilizationApi()
    except MeterUnavailableError as exc:
        pytest.skip(f"no NVML on this host: {exc}")
    sampler = UtilizationSampler(api)
    try:
        assert sampler.read() == []
        time.sleep(0.2)
        readings = sampler.read()
    finally:
        sampler.close()
    assert [r.target for r in readings] == [f"gpu{i}" for i in sampler.gpus]
    for reading in readings:
        assert reading.activity is not None and 0.0 <= reading.activity <= 1.0
        assert reading.end_ns - reading.start_ns >= 0.2e9  # the sleep between the reads
