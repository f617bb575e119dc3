"""`%%nbtrain --slurm`: the cell's recipe as a SLURM batch job, followed live from the notebook.

    %%nbtrain --slurm --num-nodes 2 --devices 4 --partition gpu --time 01:00:00 --sbatch account=proj
    %%nbtrain --slurm-dry-run --num-nodes 2 --partition gpu      (shows the batch script; submits nothing)

nbtrain.slurm.submit writes the run directory and submits the job through submitit; the
cell then follows the job: its state (PENDING, RUNNING, ... with SLURM's reason) in one line
updated in place, rank 0's metrics through the same live progress bar and plot as a run in
the kernel, and at the end the trained weights in the notebook's model and the result kept
and recorded like any run. Interrupting the kernel cancels the job.
"""
from __future__ import annotations

import html

from IPython.core.error import UsageError
from IPython.display import display

from ..options import flag_name, option_name
from . import errors

OPTIONS = {
    "partition": ("NAME", "SLURM partition (sbatch --partition)"),
    "time": ("LIMIT", "job time limit, e.g. 01:00:00 (sbatch --time)"),
    "job_name": ("NAME", "SLURM job name (default: --name, else nbtrain)"),
    "sbatch": ("OPTION=VALUE", "any other sbatch long option, repeatable: --sbatch account=proj --sbatch exclusive"),
}
DESTS = ("slurm", "slurm_dry_run") + tuple(OPTIONS)


def add_slurm_flags(parser) -> None:
    group = parser.add_argument_group("SLURM (run the cell's recipe as a batch job: num_nodes x devices)")
    group.add_argument("--slurm", action="store_true", help="submit with sbatch and follow the job live; "
                                                            "interrupting the kernel cancels it")
    group.add_argument("--slurm-dry-run", action="store_true", help="show the batch script; submit nothing")
    for dest, (metavar, text) in OPTIONS.items():
        group.add_argument(flag_name(dest), dest=dest, metavar=metavar, default=None,
                           action="append" if dest == "sbatch" else "store", help=text)


def wanted(args, tool: str | None) -> bool:
    """Whether the flags ask for SLURM; refuses SLURM options without it, or with a checklist tool."""
    asked = args.slurm or args.slurm_dry_run
    given = [d for d in OPTIONS if getattr(args, d) is not None]
    if given and not asked:
        raise UsageError(f"%%nbtrain: {flag_name(given[0])} applies to --slurm or --slurm-dry-run; "
                         "allowed: add one of those flags")
    if asked and tool is not None:
        raise UsageError(f"%%nbtrain: {'--slurm' if args.slurm else '--slurm-dry-run'} with {flag_name(tool)}: "
                         "allowed: one of them (the checklist tools measure in this kernel)")
    if asked:
        sbatch_options(args)  # checked now, before the cell body runs
    return asked


def sbatch_options(args) -> dict:
    """The sbatch options the flags name, checked by nbtrain.slurm's own rules."""
    from ..distributed.slurm_options import SlurmOptionError, check_options as check
    options = {d: getattr(args, d) for d in ("partition", "time") if getattr(args, d) is not None}
    for item in args.sbatch or []:
        name, has_value, value = item.partition("=")
        key = option_name(name)
        if key in ("partition", "time"):
            raise UsageError(f"%%nbtrain: --sbatch {item}: allowed: {flag_name(key)} {value or 'VALUE'} (its own flag)")
        options[key] = value if has_value else True
    try:
        check(options)
    except SlurmOptionError as error:
        raise UsageError(f"%%nbtrain: --sbatch: {error}") from None
    return options


def run(magics, recipe, config, args, taken: dict | None = None):
    """Dry run: show the script. Otherwise submit, follow the job live, keep the result. `taken`: the recipe
    parts from earlier cells, said beside an error raised in one, as for a run in the kernel."""
    from .. import slurm
    job_name = args.job_name or args.name or "nbtrain"
    options = sbatch_options(args)
    views = []
    try:
        if args.slurm_dry_run:
            script = slurm.submit(recipe, config, job_name=job_name, dry_run=True, **options)
            magics.shell.user_ns["_nbtrain_sbatch"] = script
            print(f"nbtrain: the batch script for {config.num_nodes} node(s) x {config.devices} process(es); "
                  "nothing was submitted (also in _nbtrain_sbatch)\n")
            print(script)
            return None
        from ..metrics import MetricsLog
        log = MetricsLog()
        views = magics.live_views(log, args)
        state_line = JobStateLine()
        # The job continues the kernel's side of the model and it continues from the job, as with every launcher.
        handle = slurm.submit(recipe, config, job_name=job_name, log=log, **options)
        magics.shell.user_ns["_nbtrain_job"] = handle
        state_line.show(f"SLURM job {handle.job_id} submitted")
        result = handle.wait(on_state=state_line.update)
    except slurm.SlurmError as error:  # SLURM missing or refusing: its own one-line reason
        raise UsageError(f"%%nbtrain: --slurm: {error}") from None
    except KeyboardInterrupt as interrupt:
        print(f"nbtrain: {interrupt or 'interrupted'}; nothing was loaded into the model.")
        return None
    except Exception as error:
        raise errors.training_failure(magics.shell, error, taken) from None
    finally:
        for view in views:
            view.close()
    result.name = args.name
    return result


class JobStateLine:
    """The job's state in one line, updated in place (a display handle)."""

    def __init__(self):
        self.handle = None
        self.states: list[str] = []

    def show(self, text: str) -> None:
        bundle = {"text/plain": text, "text/html": f"<div class='nbtrain-slurm-state'>{html.escape(text)}</div>"}
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)

    def update(self, state) -> None:
        self.states.append(state.state)
        self.show(f"SLURM job: {state}")
