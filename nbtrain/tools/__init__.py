"""The checklist as tools: each measures on the live engine inside a trial and puts the model back.

`registry` (every tool, in order; each declares its options once with `tool_options.declare`,
in the vocabulary of `options`), `trial` (the trial around every measurement), `diagnose`
(nbtrain.profile), `tune` and `tune_workers` (batch size, workers), `lr_finder`, `leaks` (graph
leaks, sync points), `cache`, `checklist` + `checklist_items` (the walk) and `waterfall` (its figure).
"""
