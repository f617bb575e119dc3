"""The checklist as tools: each measures in a trial that borrows the live model and gives it back.

`registry` (every tool, in order; each declares its options once with `tool_options.declare`,
in the vocabulary of `options`), `trial` (borrow: the trial every measurement runs in), `ab` (nbtrain.ab), `ceilings`
(nbtrain.ceilings: read in `step_timing`), `diagnose`
(nbtrain.profile), `tune` and `tune_workers` (batch size, workers), `lr_finder`, `leaks` (graph
leaks, sync points), `cache`, `checklist` + `checklist_items` (the walk) and `waterfall` (its figure).
"""
