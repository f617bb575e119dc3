"""nbtrain: try the PyTorch training-speed checklist on your own live model, and see the effect."""
from .api import fit
from .config import ConfigError, TrainConfig
from .engine import Engine
from .metrics import MetricsLog
from .recipe import Recipe, RecipeError
from .result import RunResult

__version__ = "0.1.0"
__all__ = ["fit", "TrainConfig", "ConfigError", "Engine", "MetricsLog", "Recipe", "RecipeError", "RunResult"]


def load_ipython_extension(ipython):
    """`%load_ext nbtrain` registers the %%nbtrain magics (IPython is imported only here)."""
    from .notebook.magic import load_ipython_extension as load
    load(ipython)
