"""Every figure nbtrain shows, as numbers: steady rates with their spread, A/B verdicts, the ceilings' arithmetic.

The floor for numbers: nothing here runs an engine or a tool (tools/ measure through trials and hand their
readings here); it imports only its own floor (records, plotting for its figures) and the config floor below
it (config, format) (test_boundaries.py).

- `steady`: a run's rate after its warm-up, with a 95% interval and the spread of its blocks;
- `verdict`: the ratio of two rates with its interval, in words ("no measurable difference");
- `withheld`: when a verdict is withheld, and why: one frozen record (kind, numbers, words) every reader reads;
- `ab`: the result of two configs measured in alternation (tools/ab.py measures them), in words;
- `ceilings`: a step's four ceilings (data, host, compute, memory), each with its interval (tools/ceilings.py
  reads them);
- `race`: configs raced in blocks, the walk's screening; `load`: the machine's load during a reading;
- `forecast`, `forecast_result`: the scaling forecast's arithmetic (DDP buckets, ring all-reduce, ranges);
- `bottleneck`: their verdict as data: the binding ceiling, the ratios, the remedies in order;
- `device_rates`: the device's peak FLOP/s and bandwidth, a step's FLOPs and bytes, the host's share.
"""
from .bottleneck import Bottleneck, Remedy, bottleneck
from .steady import SteadyRate, of_columns, steady_rate
from .verdict import Verdict, paired, unpaired

__all__ = ["Bottleneck", "Remedy", "SteadyRate", "Verdict", "bottleneck", "of_columns", "paired", "steady_rate",
           "unpaired"]
