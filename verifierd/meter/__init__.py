"""verifierd's compute meter: how much GPU (or CPU) work each engine batch cost.

Use (verifierd.services.compute_meter does this for the daemon):
    sampler, _ = open_gpu_sampler(gpu_indices)    # GPM, else NVML utilisation; or CpuSampler()
    meter = Meter(sampler)                        # 10 Hz
    meter.start()
    targets = meter.targets_for(gpus=engine.gpus, pids=engine.pids)
    ...run a batch between t0 and t1 (time.time_ns())...
    cost = meter.cost(t0, t1, targets)            # WindowCost: activity-seconds, coverage
    shares = apportion(cost.activity_seconds, [tokens of each verdict])
    meter.stop()

Modules: readings (the values), integration (the maths), ring (recent readings), sampling
(the thread and the Meter), nvml_gpm / nvml_utilization / cpu (the samplers), nvml_recording
(record and replay NVML call sequences), nvml_library (loading NVML), selection (which sampler).
"""

from verifierd.meter.errors import MeterError, MeterUnavailableError, NvmlCallError
from verifierd.meter.integration import Integral, Point, apportion
from verifierd.meter.readings import Method, Reading, WindowCost
from verifierd.meter.sampling import Meter, Sampler
from verifierd.meter.selection import MeterSettings, open_gpu_sampler, open_sampler

__all__ = [
    "Integral",
    "Meter",
    "MeterError",
    "MeterSettings",
    "MeterUnavailableError",
    "Method",
    "NvmlCallError",
    "Point",
    "Reading",
    "Sampler",
    "WindowCost",
    "apportion",
    "open_gpu_sampler",
    "open_sampler",
]
