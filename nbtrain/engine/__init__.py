"""The engine: one training loop for every mode (kernel, local workers, nodes, SLURM).

`loop.Engine` is the loop and the run; beside it, what the loop leans on: `rates` (learning
rates, warm-up, the user's schedule), `changes` (live config changes at a step boundary),
`state` (state_dict / trial()), `validation` and `evaluation` (held-out numbers, early stop),
`report` (plan, device, compile cost), `data` and `stream` (batches), `precision`, `dist`,
`split`, `fsdp`, `toggles`, `checkpoint`, `loggers`, `memory`, `monitor`, `schedule`, `support`.
It knows nothing of Jupyter.
"""
