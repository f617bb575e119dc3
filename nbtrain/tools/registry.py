"""The tool registry: every checklist tool, in the order the front-ends show them.

Each tool declares its options once, beside its code (tool_options.declare); this module only
lists the declared tools. The `%%nbtrain` flags, the panel's buttons and fields, and the way
each front-end names an option in a refusal are all generated from these entries:

    TOOLS["find_lr"].function(recipe, steps=50)   # the checked function (nbtrain.tune.find_lr)
    TOOLS["find_lr"].read({"steps": "2"})        # ToolOptionError: steps='2': allowed: a whole number >= 5 ...
"""
from __future__ import annotations

from .ab import ab
from .cache import cache
from .ceilings import ceilings
from ..walk.tool import checklist
from .diagnose import diagnose
from .forecast import forecast
from .leaks import find_graph_leaks, find_sync_points
from .tool_options import Tool
from .lr_finder import find_lr
from .tune import find_batch_size
from .tune_workers import find_workers

TOOLS: dict[str, Tool] = {function.tool.name: function.tool for function in (
    diagnose, ceilings, forecast, find_batch_size, find_workers, find_lr, find_graph_leaks, find_sync_points, checklist, ab, cache)}
