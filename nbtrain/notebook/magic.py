"""IPython magics: `%%nbtrain` trains the cell's recipe; `%nbtrain` sets defaults; runs are kept.

    %load_ext nbtrain
    %%nbtrain --max-epochs 2 --batch-size 128 --precision bf16-mixed --name run_a
    model = Net()
    train_data = DigitsDataset()
    loss_fn = nn.CrossEntropyLoss()

The cell body runs in the notebook's namespace like any cell; then the recipe is read
from it by conventional names, the flags become a TrainConfig (which alone checks
them), and `nbtrain.fit` trains with live views subscribed to the run's MetricsLog.
"""
from __future__ import annotations

import argparse
import difflib
import keyword
import re

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser, argument, magic_arguments
from IPython.display import display

from ..runs.compare import compare, resolve as compare_resolve
from ..config import TrainConfig, options
from ..options import ConfigError, flag_name, option_name
from ..flags import add_config_flags
from ..metrics import MetricsLog
from ..adapters import recipe_from_namespace
from ..recipe import NAMES, Recipe, RecipeError
from ..runs.result import RunResult
from ..runs.store import RunStore, StoreError
from ..runs.table import Row, RunsTable
from ..progress import Progress
from ..session import Session, namespace_lr
from . import arguments, earlier, errors, slurm_cell, tools
from .views import LivePlot

CONVENTIONS = "\n".join(
    [f"  {part:<14} {' or '.join(names)}" for part, names in NAMES.items()]
    + ["  lr             lr (a number: the base learning rate, unless --lr is given)"])

HELP_EPILOG = f"""\
The cell body runs first, in the notebook's namespace; then these names are read from it
(names from earlier cells count too, so a cell that does not build a new `model` continues
training the one already trained; the cell's first line, for a run, a tool, a batch job or the
panel alike, names each part an earlier cell set):
{CONVENTIONS}
`model` and `train_data` are needed, and `loss_fn` (called as loss_fn(model(x), y)) or
`training_step(model, batch)` returning the loss. The trained model stays in the namespace.
The result (config, history, summary) is kept in `_nbtrain` (and in the --name variable) and
recorded in the run store; `%nbtrain_runs` lists stored runs, `%nbtrain_compare a b` draws them
side by side. `%nbtrain FLAGS` (line magic) sets defaults for later cells; `%nbtrain --reset`
forgets them. Interrupting the kernel stops at the next step and keeps what was trained."""

_RUN_OPTIONS = ("name", "config", "store", "no_plot", "no_progress", "reset", "help") + tools.DESTS + slurm_cell.DESTS


class _FlagParser(MagicArgumentParser):
    def error(self, message):
        # argparse's own messages ("argument --batch-size: expected one argument") gain what is allowed.
        for name, (option, _) in options().items():
            if f"argument {flag_name(name)}:" in message:
                message += f"; allowed: {option.allowed}"
        raise UsageError(f"%%nbtrain: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _FlagParser(prog="%%nbtrain", usage="%(prog)s [FLAGS]  (cell)   /   %%nbtrain [FLAGS]  (defaults)",
                         description="Train the cell's model with these settings, live progress and plot; keep "
                                     "and record the result.", epilog=HELP_EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.allow_abbrev = False  # `--batch 64` is a typo, not --batch-size
    run = parser.add_argument_group("this run")
    run.add_argument("--name", help="also keep the result in this variable, and record the run under this name")
    run.add_argument("--config", metavar="VAR", help="take flags from a dict (or TrainConfig) in this variable; "
                                                     "flags on the line win")
    run.add_argument("--store", metavar="PATH", help="run-store file (default: $NBTRAIN_STORE or "
                                                     ".nbtrain/runs.sqlite here)")
    run.add_argument("--no-plot", action="store_true", help="no live plot")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--reset", action="store_true", help="(line magic) forget the defaults set before")
    run.add_argument("-h", "--help", action="store_true", help="show this help")
    tools.add_tool_flags(parser)
    slurm_cell.add_slurm_flags(parser)
    add_config_flags(parser)
    return parser


def _known_flags(parser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def _unknown_flag_error(parser, unknown: list[str], magic: str = "%%nbtrain") -> UsageError:
    """Every unknown flag (with its value and nearest known flag) in one line that points to the help,
    not a list of all eighty flags."""
    if not unknown[0].startswith("-"):
        return UsageError(f"{magic}: unexpected value {unknown[0]!r}; allowed: flags written --flag VALUE, "
                          "one value each (see %%nbtrain?)")
    known = _known_flags(parser)
    named, i = [], 0
    while i < len(unknown):
        token = unknown[i]
        i += 1
        if not token.startswith("-"):
            named.append(f"unexpected value {token!r}")
            continue
        name, _, value = token.partition("=")
        if not value and i < len(unknown) and not unknown[i].startswith("--"):
            value, i = unknown[i], i + 1
        # A flag cut short (--batch for --batch-size) beats a spelling neighbour (--sbatch).
        near = [k for k in known if k.startswith(name + "-")][:1] or difflib.get_close_matches(name, known, n=1)
        named.append(name + (f" {value}" if value else "") + (f" (did you mean {near[0]}?)" if near else ""))
    flags = sum(not n.startswith("unexpected") for n in named)
    return UsageError(f"{magic}: unknown flag{'s' if flags > 1 else ''} {', '.join(named)}; "
                      "allowed: the flags that %%nbtrain? lists")


@magics_class
class NbtrainMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self.parser = build_parser()
        self.defaults: dict = {}       # config options set by `%nbtrain FLAGS`
        self.run_defaults: dict = {}   # --store / --no-plot / --no-progress set the same way

    # --- reading the flags (nothing runs before they are all good) ----------------------

    def _parse(self, line: str, magic: str = "%%nbtrain"):
        args, unknown = self.parser.parse_known_args(arguments.split(magic, line))
        if unknown:
            raise _unknown_flag_error(self.parser, unknown, magic)
        given = {k: v for k, v in vars(args).items() if k not in _RUN_OPTIONS}
        return args, given

    def _values_from_variable(self, var: str) -> dict:
        if var not in self.shell.user_ns:
            raise UsageError(f"%%nbtrain: --config {var}: no variable named {var!r} in the namespace; allowed: "
                             "the name of a dict of options, e.g. cfg = dict(batch_size=64)")
        value = self.shell.user_ns[var]
        if isinstance(value, TrainConfig):  # the options it was given: the rest stay free for a DataLoader's own
            return value.given_dict()
        if not isinstance(value, dict):
            raise UsageError(f"%%nbtrain: --config {var}: got a {type(value).__name__}; allowed: a dict of options "
                             "(e.g. dict(batch_size=64, precision='bf16-mixed')) or a TrainConfig")
        return {option_name(str(k)): v for k, v in value.items()}

    def _config(self, args, given: dict) -> TrainConfig:
        values = dict(self.defaults)
        if args.config:
            values.update(self._values_from_variable(args.config))
        values.update(given)
        try:
            return TrainConfig.from_dict(values)
        except ConfigError as error:
            raise errors.config_usage_error(error) from None

    # --- the magics ---------------------------------------------------------------------

    @line_cell_magic
    def nbtrain(self, line, cell=None):
        args, given = self._parse(line, "%%nbtrain" if cell is not None else "%nbtrain")
        if args.help:
            print(self.parser.format_help())
            return
        tool = tools.chosen_tool(args)
        batch_job = slurm_cell.wanted(args, tool)
        if cell is None and tool is None:
            return self._set_defaults(args, given)
        # A tool as a line magic works on the recipe already in the namespace, asked for as such: every part is
        # an earlier cell's on purpose, so its first line does not say so (an error in one still does).
        whole_recipe_asked, cell = cell is None, cell or ""
        if args.reset:
            raise UsageError("%%nbtrain: --reset applies to the line magic (%nbtrain --reset)")
        if args.name is not None and (not args.name.isidentifier() or keyword.iskeyword(args.name)):
            raise UsageError(f"%%nbtrain: --name {args.name!r}: allowed: a Python variable name "
                             "(letters, digits and _, not starting with a digit), e.g. run_a")
        config = self._config(args, given)
        tool_kwargs = tools.keywords(tool, args) if tool not in (None, "panel") else {}
        namespace = self.shell.user_ns
        before = earlier.names_before(namespace)
        filename, source = self._run_body(cell)
        assigned = earlier.assigned_names(source)
        try:
            recipe = recipe_from_namespace(namespace)
        except RecipeError as error:
            raise UsageError(f"%%nbtrain: {error}") from None
        try:
            config = namespace_lr(namespace, config, given="lr" in given)
        except ConfigError as error:
            raise UsageError(f"%%nbtrain: {error.render(lambda o: 'lr (in the namespace)')}") from None
        taken = earlier.taken_from_earlier(namespace, before, assigned)
        if taken and not whole_recipe_asked:  # whatever uses the recipe below (a run, a tool, a batch job, the panel)
            print(earlier.header(taken))
        if batch_job:
            result = slurm_cell.run(self, recipe, config, args, taken)
            return None if result is None else self._keep(result, recipe, args)
        if tool == "panel":
            return self._show_panel(recipe, config, args)
        cell_lines = (filename, earlier.lines_setting(namespace, assigned))  # shown where an error has no cell frame
        if tool is not None:
            result = tools.run_tool(self.shell, tool, recipe, config, tool_kwargs, taken, cell_lines)
            return None if result is None else tools.show_result(self, tool, result, args)
        result = self._train(recipe, config, args, taken, cell_lines)
        if result is None:
            return
        self._keep(result, recipe, args)

    @line_cell_magic
    def nbtrain_checklist(self, line, cell=None):
        """The automated checklist walk on the namespace's recipe (the cell body runs first, if any):
        `%nbtrain_checklist --budget 60 --keep-best [training flags]`; see `%%nbtrain?` (tool options)."""
        arguments.split("%nbtrain_checklist", line)  # unbalanced quotes: quoted as the user wrote the line
        try:
            self.nbtrain(f"--checklist {line}", cell)  # no cell: the line magic's whole recipe is the namespace's
        except UsageError as error:
            message = re.sub(r"^%%?nbtrain:", "%nbtrain_checklist:", str(error), count=1)
            raise UsageError(message) from None

    def _set_defaults(self, args, given: dict) -> None:
        if args.name is not None:
            raise UsageError("%nbtrain: --name applies to a %%nbtrain cell, not to the defaults")
        if args.reset:
            self.defaults, self.run_defaults = {}, {}
        values = {**self.defaults, **(self._values_from_variable(args.config) if args.config else {}), **given}
        try:
            TrainConfig.from_dict(values)  # check now, so a bad default never reaches a cell
        except ConfigError as error:
            raise errors.config_usage_error(error, "%nbtrain") from None
        self.defaults = values
        for key in ("store", "no_plot", "no_progress"):
            if getattr(args, key):
                self.run_defaults[key] = getattr(args, key)
        shown = ", ".join(f"{flag_name(k)} {v}" for k, v in {**self.defaults, **self.run_defaults}.items())
        print(f"nbtrain defaults for later cells: {shown or 'none (TrainConfig defaults)'}")

    def _run_body(self, cell: str) -> tuple[str, str]:
        """Run the cell body as the cell itself: its line numbers, the notebook's namespace; (the name it ran
        under, the Python source it ran: the cell's lines at their own numbers)."""
        shell = self.shell
        raw = "\n" + cell
        # IPython's transforms drop leading blank lines; put them back, plus one for the %%nbtrain
        # line, so the body's line numbers in a traceback are the cell's.
        blank = next((i for i, text in enumerate(cell.splitlines()) if text.strip()), 0)
        source = "\n" * (1 + blank) + shell.transform_cell(cell)
        filename = shell.compile.cache(source, shell.execution_count, raw_code=raw)
        try:
            code = shell.compile(source, filename, "exec")
        except SyntaxError as error:  # one line naming the cell line, not the compiler's frames in nbtrain
            text = (error.text or "").strip()
            raise UsageError(f"%%nbtrain: the cell body is not valid Python: {error.msg} on cell line {error.lineno}"
                             f"{': ' + text if text else ''}") from None
        try:
            exec(code, shell.user_global_ns, shell.user_ns)
        except (Exception, KeyboardInterrupt) as error:
            raise errors.show_as_user_error(shell, error, errors.from_cell(error.__traceback__, filename)) from None
        return filename, source

    def _show_panel(self, recipe, config: TrainConfig, args):
        """`%nbtrain --panel`: the control panel over the cell's recipe, kept in _nbtrain_panel (and --name)."""
        from .panel import panel
        made = panel(recipe, config, display=True, store=self._option(args, "store"))
        self.shell.user_ns["_nbtrain_panel"] = made
        if args.name:
            self.shell.user_ns[args.name] = made
        return made

    def _option(self, args, key):
        return getattr(args, key) or self.run_defaults.get(key)

    def live_views(self, log: MetricsLog, args) -> list:
        """The live progress bar and plot, subscribed to `log`, unless the flags turned them off."""
        progress = None if self._option(args, "no_progress") else log.subscribe(Progress(args.name or ""))
        # A terminal IPython shows no pictures: there each frame was a line of text, printed into the bar.
        draws = "image/png" in self.shell.display_formatter.active_types
        plot = None if self._option(args, "no_plot") or not draws else LivePlot(title=args.name).follow(log)
        return [view for view in (progress, plot) if view is not None]

    def _train(self, recipe: Recipe, config: TrainConfig, args, taken: dict, cell=None) -> RunResult | None:
        """One run; `taken`: the recipe parts from earlier cells (said beside an error raised in one); `cell`:
        (its name, {part: the cell's line that set it}), shown where an error in a part has no frame of it."""
        log = MetricsLog()
        views = self.live_views(log, args)
        try:
            result = Session(self._option(args, "store")).train(recipe, config, log, name=args.name)
            # What the live views cost inside the loop, measured, so the benchmark (and a user) can check it.
            result.extras["views_s"] = sum(view.cost_s for view in views)
            return result
        except KeyboardInterrupt:
            if len(log):
                raise  # a second interrupt inside a step: the engine could not finish it
            print("nbtrain: interrupted before the first step; nothing was trained.")
            return None
        except Exception as error:
            raise errors.training_failure(self.shell, error, taken, cell) from None
        finally:
            for view in views:
                view.close()

    def _keep(self, result: RunResult, recipe: Recipe, args) -> None:
        namespace = self.shell.user_ns
        notes = Session(self._option(args, "store")).record(result, recipe.model)
        namespace["_nbtrain"] = result
        if args.name:
            namespace[args.name] = result
        notes.append(f"result in {args.name + ' and ' if args.name else ''}_nbtrain")
        # the run's own table (RunResult.rows()), the notes under it
        display({"text/plain": "\n".join([result.table(), *notes]), "text/html": result.html(notes)}, raw=True)

    @line_magic
    @magic_arguments()
    @argument("--last", type=int, default=None, help="only the newest N runs")
    @argument("--store", default=None, help="run-store file (default: $NBTRAIN_STORE or .nbtrain/runs.sqlite)")
    def nbtrain_runs(self, line):
        """List the runs recorded in the run store (they survive kernel restarts)."""
        args = arguments.parse(self.nbtrain_runs, line)
        store = RunStore(args.store or self.run_defaults.get("store"))
        try:
            display(RunsTable([Row.stored(run) for run in store.runs(last=args.last)], store.path))
        except StoreError as error:
            raise UsageError(f"%nbtrain_runs: {error}") from None

    @line_magic
    @magic_arguments()
    @argument("runs", nargs="+", help="result variables, stored run names, or run ids (#3)")
    @argument("--loss", type=float, default=None, help="the loss to time (default: the lowest every run reached)")
    @argument("--store", default=None, help="run-store file (default: $NBTRAIN_STORE or .nbtrain/runs.sqlite)")
    @argument("--save", default=None, metavar="PATH", help="also save the figure to this file")
    def nbtrain_compare(self, line):
        """Draw runs side by side: loss against time, time to a loss, samples/s, peak memory."""
        args = arguments.parse(self.nbtrain_compare, line)
        store = RunStore(args.store or self.run_defaults.get("store"))
        namespace = self.shell.user_ns
        runs = [namespace[r] if isinstance(namespace.get(r), RunResult) else r for r in args.runs]
        try:
            comparison = compare(*runs, loss=args.loss, store=store, path=args.save)
        except StoreError as error:
            raise UsageError(f"%nbtrain_compare: {error}") from None
        namespace["_nbtrain_compare"] = comparison
        display(comparison)

    @line_magic
    @magic_arguments()
    @argument("run", nargs="?", default=None,
              help="a result variable, a stored run name or id (default: the last run, _nbtrain)")
    @argument("--store", default=None, help="run-store file (default: $NBTRAIN_STORE or .nbtrain/runs.sqlite)")
    def nbtrain_export_config(self, line):
        """A run's settings as code: the %%nbtrain line and the TrainConfig(...) that reproduce them."""
        args = arguments.parse(self.nbtrain_export_config, line)
        namespace = self.shell.user_ns
        run = namespace.get(args.run or "_nbtrain")
        if not isinstance(run, RunResult):
            if args.run is None:
                raise UsageError("%nbtrain_export_config: no run yet in this kernel; give a stored run's name or id")
            try:
                run = compare_resolve([args.run], RunStore(args.store or self.run_defaults.get("store")))[0]
            except StoreError as error:
                raise UsageError(f"%nbtrain_export_config: {error}") from None
        print(run.config.as_flags())
        print("config = nbtrain." + run.config.as_code())


NbtrainMagics.nbtrain.__doc__ = build_parser().format_help()


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(NbtrainMagics)
