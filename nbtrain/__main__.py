"""`python -m nbtrain demo`: train the embedded demo on this machine and report what was measured;
`python -m nbtrain doctor`: whether the installed torch and torchvision load together, and what to run if not."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import TrainConfig
from .options import ConfigError, flag_name, option_name
from .flags import add_config_flags, config_from_flags


def _demo(args) -> int:
    from .api import fit
    from .progress import Progress
    from .demo import digits_recipe
    from .metrics import MetricsLog

    base = TrainConfig(max_epochs=10, batch_size=64, log_every_n_steps=5)
    config = config_from_flags(args, base)
    log = MetricsLog()
    log.subscribe(Progress(disable=args.quiet))
    print(f"nbtrain demo: an MLP on scikit-learn's handwritten digits (1,437 train / 360 held-out), "
          f"{config.device_type}, {config.precision}", flush=True)
    result = fit(recipe=digits_recipe(seed=config.seed or 0), config=config, log=log, name="demo")
    print(result.table())
    print(f"loss curve: {_save_plot(result, args.out, 'nbtrain-demo-loss.png')}")
    return 0


def _save_plot(result, folder: str, name: str) -> Path:
    """Draw a result's plot into `folder` (created if needed); returns the file's path."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    result.plot(path=out / name)
    return out / name


def _tour(args) -> int:
    from .walk.tool import checklist
    from .demo import digits_recipe

    config = config_from_flags(args, TrainConfig(batch_size=32))
    print(f"nbtrain tour: the checklist walk on the digits demo ({config.device_type}), "
          f"budget {args.budget_s:g} s; every number below is measured now", flush=True)
    walk = checklist(digits_recipe(seed=config.seed or 0), config=config, budget_s=args.budget_s,
                     target_global_batch=args.target_global_batch)
    print(walk.table())
    print(f"waterfall chart: {_save_plot(walk, args.out, 'nbtrain-tour-waterfall.png')}")
    return 0


def _export(args) -> int:
    """`nbtrain export FOLDER --recipe pkg.module:factory [config flags] [--sbatch partition=gpu ...]`."""
    import importlib
    import shlex
    from .distributed.slurm_export import export
    module_name, _, function = args.recipe.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError, ValueError) as error:
        print(f"nbtrain export: --recipe {args.recipe}: allowed: MODULE:FUNCTION returning a Recipe, importable "
              f"here ({error})", file=sys.stderr)
        return 2
    options = {}
    for item in args.sbatch:
        name, has_value, value = item.partition("=")
        options[option_name(name)] = value if has_value else True
    batch = export(factory(), config_from_flags(args), args.folder, job_name=args.job_name, **options)
    print(f"wrote {batch.parent / 'train.py'} (python train.py trains here) and {batch}\n"
          f"submit with: sbatch {shlex.quote(str(batch))}")
    return 0


def _doctor(args) -> int:
    from .doctor import main as doctor
    return doctor()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nbtrain", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train the embedded digits demo and print a summary")
    demo.add_argument("--out", default=".", help="folder for the loss-curve PNG (default: here)")
    demo.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_flags(demo)
    tour = commands.add_parser("tour", help="walk the speed checklist on the digits demo and chart what helped")
    tour.add_argument("--budget-s", type=float, default=60.0, help="time budget of the walk in seconds (default 60)")
    tour.add_argument("--target-global-batch", type=int, default=None, help="global batch to reach by accumulation")
    tour.add_argument("--out", default=".", help="folder for the waterfall PNG (default: here)")
    add_config_flags(tour)
    exporter = commands.add_parser("export", help="write a recipe as train.py plus its SLURM batch file")
    exporter.add_argument("folder", help="a new folder for train.py, train.sbatch and the shipped recipe")
    exporter.add_argument("--recipe", default="nbtrain.demo:digits_recipe",
                          help="MODULE:FUNCTION that returns the Recipe (default: the digits demo)")
    exporter.add_argument("--job-name", default="nbtrain", help="the SLURM job name")
    exporter.add_argument("--sbatch", action="append", default=[], metavar="OPTION[=VALUE]",
                          help="an sbatch option for the batch file, e.g. --sbatch partition=gpu (repeatable)")
    add_config_flags(exporter)
    commands.add_parser("doctor", help="check that the installed torch and torchvision load together")
    args = parser.parse_args(argv)
    commands_run = {"tour": _tour, "export": _export, "doctor": _doctor}
    try:
        return commands_run.get(args.command, _demo)(args)
    except ConfigError as error:
        print(f"nbtrain: {error.render(flag_name, quote=False)}", file=sys.stderr)
        return 2
    except (ValueError, FileExistsError) as error:  # SlurmOptionError is a ValueError
        print(f"nbtrain {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
