"""The engine: one training loop for every mode (kernel, local workers, nodes, SLURM).

`engine.Engine` keeps what lives across runs (model, optimizer, loader, precision, config, position);
each `Engine.run()` is a `loop.Run`, which holds what a run resets and reads as the run, top to bottom.
Beside them, what they lean on, as functions or objects the Engine holds: `rates` (learning rates,
warm-up, the user's schedule), `changes` (live config changes at a step boundary), `state`
(state_dict / trial()), `evaluation` (held-out numbers), `report` (plan, device, compile cost), `data`
and `stream` (batches), `precision`, `dist`, `split`, `fsdp`, `toggles`, `checkpoint`, `loggers`,
`memory`, `monitor`, `schedule`, `support`. It knows nothing of Jupyter.
"""
