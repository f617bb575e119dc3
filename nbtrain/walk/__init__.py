"""The checklist walk, a wing of its own: follow the bottleneck on the live model, keep what a race shows.

`tool` (nbtrain.checklist: the walk as a checklist tool, declared in the registry's vocabulary and listed by
tools/registry.py, one floor up), `walker` (the walk: its clock, its path along the bottleneck, its decisions),
`items` (each checklist item, registered once with the remedies it answers), `bench` (the Bench the walk
measures through, a Protocol: the live model's trial here, a simulated machine in the tests), `headline` (the
final head to head), `result` (ChecklistResult, printed as its table) and `waterfall` (its figure).
"""
