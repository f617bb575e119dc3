"""nbtrain: try the PyTorch training-speed checklist on your own live model, and see the effect."""
from .api import fit
from .runs.compare import compare
from .config import TrainConfig
from .options import ConfigError
from .engine.engine import Engine
from .metrics import MetricsLog
from .recipe import Recipe, RecipeError
from .runs.result import RunResult
# The checklist as tools (functions; their modules live in nbtrain.tools).
from .tools.cache import cache
from .walk.tool import checklist
from .tools.diagnose import profile
from .tools.ab import ab
from .tools.ceilings import ceilings
from .tools.forecast import forecast
from .distributed.launch import launch  # the function; its module's helpers: `from nbtrain.distributed.launch import ...`
from .engine.split import split
from . import slurm  # nbtrain.slurm.submit / attach / export
from .tools import leaks, tune  # nbtrain.tune.find_workers, nbtrain.leaks.find_graph_leaks

from .version import __version__
__all__ = ["fit", "ab", "ceilings", "forecast", "compare", "panel", "TrainConfig", "ConfigError", "Engine", "MetricsLog", "Recipe", "RecipeError",
           "RunResult", "cache", "checklist", "profile", "launch", "split"]


def panel(recipe_or_namespace=None, config=None, display=True):
    """An ipywidgets control panel over one live model (ipywidgets is imported only here).

    `recipe_or_namespace`: a Recipe, a namespace such as globals(), or nothing for the
    notebook's own names. See nbtrain.notebook.panel.
    """
    from .notebook.panel import panel as make_panel
    return make_panel(recipe_or_namespace, config=config, display=display)


def load_ipython_extension(ipython):
    """`%load_ext nbtrain` registers the %%nbtrain magics (IPython is imported only here)."""
    from .engine.imports import settle
    from .notebook.magic import load_ipython_extension as load
    settle()  # torch's heavy lazy imports now, the interrupt held: a later cell's interrupt cannot cut them short
    load(ipython)
