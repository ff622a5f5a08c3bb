"""verifierd's compute meter: how much GPU (or CPU) work each engine batch cost.

Use:
    meter = open_meter(MeterSettings())        # GPM, else NVML utilisation, else CPU-seconds
    meter.start()
    targets = meter.targets_for(gpus=engine.gpu_indices, pids=[engine.pid])
    ...run a batch between t0 and t1 (time.time_ns())...
    cost = meter.cost(t0, t1, targets)         # WindowCost: activity-seconds, coverage
    shares = apportion(cost.activity_seconds, [v.token_count for v in verdicts])
    meter.stop()

Modules: readings (the values), integration (the maths), ring (recent readings), sampling
(the thread and the Meter), nvml_gpm / nvml_utilization / cpu (the samplers), nvml_recording
(record and replay NVML call sequences), selection (which sampler to use).
"""

from verifierd.meter.errors import MeterError, MeterUnavailableError, NvmlCallError
from verifierd.meter.integration import Integral, Point, apportion
from verifierd.meter.readings import Method, Reading, WindowCost
from verifierd.meter.sampling import Meter, Sampler
from verifierd.meter.selection import MeterSettings, open_meter, open_sampler

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
    "open_meter",
    "open_sampler",
]
