"""Every figure nbtrain shows, measured one way: steady rates with their spread, A/B verdicts.

- `steady`: a run's rate after its warm-up, with a 95% interval and the spread of its blocks;
- `verdict`: the ratio of two rates with its interval, in words ("no measurable difference");
- `ab`: two configs measured in alternation on the live model;
- `ceilings`: the loader alone, the model alone, FLOPs against the device's measured peak.
"""
from .steady import SteadyRate, of_columns, steady_rate
from .verdict import Verdict, paired, unpaired

__all__ = ["SteadyRate", "Verdict", "of_columns", "paired", "steady_rate", "unpaired"]
