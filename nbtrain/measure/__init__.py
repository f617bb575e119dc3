"""Every figure nbtrain shows, measured one way: steady rates with their spread, A/B verdicts.

- `steady`: a run's rate after its warm-up, with a 95% interval and the spread of its blocks;
- `verdict`: the ratio of two rates with its interval, in words ("no measurable difference");
- `ab`: two configs measured in alternation on the live model;
- `ceilings`: a step's four ceilings (data, host, compute, memory), each measured with its interval;
- `bottleneck`: their verdict as data: the binding ceiling, the ratios, the remedies in order;
- `device_rates`: the device's peak FLOP/s and bandwidth, a step's FLOPs and bytes, the host's share.
"""
from .bottleneck import Bottleneck, Remedy, bottleneck
from .steady import SteadyRate, of_columns, steady_rate
from .verdict import Verdict, paired, unpaired

__all__ = ["Bottleneck", "Remedy", "SteadyRate", "Verdict", "bottleneck", "of_columns", "paired", "steady_rate",
           "unpaired"]
