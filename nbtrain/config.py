"""TrainConfig: the one description of a run, its values validated once, here.

Every front-end (Python call, cell magic, panel, launcher) builds a TrainConfig and
never re-checks values itself. Each field's `Option` (options.py) says how to read it
and what is allowed; every problem found is collected into one ConfigError. Whether a
target can *run* a valid config (its GPUs, its cores) is checked when a run starts, against
that target's inventory (`check_runnable`): a laptop may write a config for GPU nodes.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import shlex
from dataclasses import dataclass
from typing import Any

from . import hardware
from .options import ConfigError, Option, Problem, _Reject, _opt  # noqa: F401  (ConfigError, Problem: config's errors)

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")
_PRECISION_ALIASES = {
    "32": "32-true", "32-true": "32-true", "fp32": "32-true",
    "16": "16-mixed", "16-mixed": "16-mixed", "fp16": "16-mixed",
    "bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed",
}
ACCELERATORS = ("auto", "cpu", "cuda", "mps")
STRATEGIES = ("auto", "ddp", "dp", "fsdp")
DEFAULT_TIMEOUT_S = 1800.0  # torch's own default for a collective
LR_RULES = ("none", "linear", "sqrt")
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
MATMUL_PRECISIONS = ("highest", "high", "medium")
OPTIMIZER_IMPLS = ("auto", "for-loop", "foreach", "fused")
MAX_BATCH = 2**24
MAX_WORKERS = 256



@dataclass(frozen=True)
class TrainConfig:
    """How to train: device, precision, loader, batch, accumulation, budget, learning rate."""

    accelerator: str = _opt("auto", "choice", "one of auto, cpu, cuda (or gpu), mps",
                            "device type; auto picks cuda, then mps, then cpu",
                            choices=ACCELERATORS, aliases={"gpu": "cuda"})
    devices: int = _opt(1, "int", "a whole number >= 1",
                        "processes per node; more than 1 launches DDP workers", low=1)
    num_nodes: int = _opt(1, "int", "a whole number >= 1", "machines (multi-node DDP)", low=1)
    strategy: str = _opt("auto", "choice", "one of auto, ddp, dp, fsdp",
                         "multi-device strategy: ddp (default for devices > 1), fsdp (shard a model too big for "
                         "one device) or dp (DataParallel, for comparison)",
                         choices=STRATEGIES)
    node_rank: int | None = _opt(None, "int", "a whole number >= 0, or None ($NBTRAIN_NODE_RANK)",
                                 "this machine's place among num_nodes (multi-node)",
                                 low=0, nullable=True)
    rdzv_endpoint: str | None = _opt(None, "endpoint", "'host:port' with a port from 1 to 65535 (e.g. "
                                     "10.0.0.1:29400, [::1]:29400), or None ($NBTRAIN_RDZV_ENDPOINT)",
                                     "the c10d rendezvous every node reaches (multi-node)")
    rdzv_host: str | None = _opt(None, "host", "a host name or IP address of this machine, or None (127.0.0.1)",
                                 "address the ranks meet on (one machine) / this node's address (multi-node)")
    find_unused_parameters: bool = _opt(False, "bool", "true or false",
                                        "DDP: allow parameters that take no part in a step's loss (DDP then "
                                        "looks for them after every forward, which costs time)")
    timeout: float | None = _opt(None, "float", f"a number of seconds > 0, or None ({DEFAULT_TIMEOUT_S:g}, "
                                 "torch's default)", "how long a rank may wait in one collective before the run "
                                 "fails", low=1e-300, high=1e9, nullable=True)
    precision: str = _opt("32-true", "choice", "one of 32-true, 16-mixed, bf16-mixed (or 32, 16, bf16)",
                          "numeric precision", choices=PRECISIONS, aliases=_PRECISION_ALIASES)
    batch_size: int = _opt(32, "int", f"a whole number from 1 to {MAX_BATCH}",
                           "samples per batch, per process", low=1, high=MAX_BATCH)
    accumulate_grad_batches: int = _opt(1, "int", "a whole number >= 1",
                                        "micro-batches per optimizer step", low=1, high=2**20)
    max_epochs: int | None = _opt(None, "int", "a whole number >= 1, or None",
                                  "epochs to train in this run (default 1 when max_steps is unset)",
                                  low=1, nullable=True)
    max_steps: int | None = _opt(None, "int", "a whole number >= 1, or None / -1 for no step limit",
                                 "optimizer steps to train in this run", low=1, nullable=True)
    num_workers: int = _opt(0, "int", f"a whole number from 0 to {MAX_WORKERS}",
                            "DataLoader worker processes", low=0, high=MAX_WORKERS)
    pin_memory: bool | None = _opt(None, "bool", "true, false or auto (pinned when training on CUDA)",
                                   "page-locked host batches for faster copies to the GPU", nullable=True)
    persistent_workers: bool = _opt(False, "bool", "true or false (true needs num_workers >= 1)",
                                    "keep loader workers alive between epochs")
    prefetch_factor: int | None = _opt(None, "int", "a whole number >= 1, or None (needs num_workers >= 1)",
                                       "batches each worker loads ahead", low=1, high=1024, nullable=True)
    shuffle: bool = _opt(True, "bool", "true or false", "reshuffle the training data every epoch")
    drop_last: bool = _opt(False, "bool", "true or false", "drop the last incomplete batch of an epoch")
    # Automatic by default: the batches are the DataLoader's, bit for bit (same sampler, seed and values),
    # so it changes what runs, never what is learned. When nbtrain may hold is one rule, stated in
    # engine/data.py: auto holds only a TensorDataset (or a Subset of one), whose samples are rows of its
    # tensors and nothing more; true also holds another Dataset, but only one whose samples are fixed
    # (reading them twice gives the same values, or it says so), never a random augmentation's one read.
    preload_data: bool | None = _opt(None, "bool", "true, false or auto (a TensorDataset, when num_workers=0 "
                                     "and it fits)", "hold the training tensors in memory on the training device "
                                     "and cut each batch by index, in the DataLoader's order (no per-sample reads "
                                     "and collate); num_workers >= 1, a DataLoader's own sampler or samples that "
                                     "change at each read keep the DataLoader", nullable=True)
    lr: float | None = _opt(None, "float", "a number > 0, or None (keep the optimizer's own rate)",
                            "base learning rate (before scaling)", low=1e-300, nullable=True)
    scale_lr: str = _opt("none", "choice", "one of none, linear, sqrt",
                         "scale the rate with global batch / base_batch_size", choices=LR_RULES)
    base_batch_size: int | None = _opt(None, "int", "a whole number >= 1",
                                       "the global batch the base learning rate was tuned for (scale_lr)", low=1, nullable=True)
    warmup_steps: int = _opt(0, "int", "a whole number >= 0",
                             "linear warm-up steps from the base to the scaled rate", low=0)
    gradient_clip_val: float | None = _opt(None, "float", "a number > 0, or None",
                                           "clip the gradient norm to this value", low=1e-300, nullable=True)
    seed: int | None = _opt(0, "int", "a whole number >= 0, or None", "random seed (None: not seeded)",
                            low=0, high=2**63 - 1, nullable=True)
    compile: str = _opt("none", "choice", "one of none, default, reduce-overhead, max-autotune (or true / false)",
                        "torch.compile the model (compile time is measured apart from step time)",
                        choices=COMPILE_MODES, aliases={"true": "default", "on": "default", "false": "none", "off": "none"})
    channels_last: bool = _opt(False, "bool", "true or false", "channels-last memory format for conv models and inputs")
    matmul_precision: str | None = _opt(None, "choice", "one of highest, high, medium (TF32 on Ampere+), or None",
                                        "float32 matmul precision on CUDA", choices=MATMUL_PRECISIONS, nullable=True)
    cudnn_benchmark: bool | None = _opt(None, "bool", "true, false or None (leave torch's setting)",
                                        "let cuDNN pick the fastest convolution algorithms", nullable=True)
    optimizer_impl: str = _opt("auto", "choice", "one of auto, for-loop, foreach, fused",
                               "optimizer kernels: torch's default, per-tensor loop, foreach or fused",
                               choices=OPTIMIZER_IMPLS)
    activation_checkpointing: str | None = _opt(None, "names", "None, auto (every top-level block with "
                                                "parameters) or submodule names separated by commas",
                                                "recompute these submodules' activations in backward to save memory")
    checkpoint_every: str | None = _opt(None, "every", "N optimizer steps, a duration such as 90s / 10m / 1h, "
                                        "or None", "write a checkpoint this often (atomically)")
    checkpoint_dir: str | None = _opt(None, "text", "a folder path, or None (.nbtrain/checkpoints)",
                                      "where checkpoints are written")
    resume: str | None = _opt(None, "text", "a checkpoint file, 'last' (newest in checkpoint_dir), or None",
                              "continue a run from a checkpoint")
    on_nonfinite_loss: str = _opt("stop", "choice", "one of stop, continue",
                                  "stop (naming the step) when the loss becomes NaN/inf, or continue",
                                  choices=("stop", "continue"))
    val_every_n_steps: int | None = _opt(None, "int", "a whole number >= 1, or None (at the end of each epoch)",
                                         "how often the held-out data is evaluated", low=1, nullable=True)
    monitor: str | None = _opt(None, "text", "a held-out number such as val_loss, val_acc or val_<metric>, or None",
                               "what early stopping and restore_best watch")
    mode: str = _opt("auto", "choice", "one of auto, min, max (auto: max for accuracy-like names, else min)",
                     "whether the monitored number should go down (min) or up (max)", choices=("auto", "min", "max"))
    patience: int | None = _opt(None, "int", "a whole number >= 1, or None (no early stopping)",
                                "stop after this many validations without improvement of `monitor`", low=1,
                                nullable=True)
    restore_best: bool = _opt(False, "bool", "true or false",
                           "at the end, put back the weights of the best validation of `monitor`")
    logger: str = _opt("none", "choice", "one of none, tensorboard, csv",
                       "also write the run's metrics for TensorBoard or as CSV files (rank 0 only)",
                       choices=("none", "tensorboard", "csv"))
    logger_dir: str | None = _opt(None, "text", "a folder path, or None (.nbtrain/logs)",
                                  "where the logger writes (a folder per run)")
    log_every_n_steps: int = _opt(10, "int", "a whole number >= 1",
                                  "read losses back from the device every N optimizer steps", low=1)

    def __post_init__(self):
        problems: list[Problem] = []
        for f in dataclasses.fields(self):
            option: Option = f.metadata["option"]
            raw = getattr(self, f.name)
            if f.name == "max_steps" and raw in (-1, "-1"):
                raw = None
            try:
                object.__setattr__(self, f.name, option.read(raw))
            except _Reject:
                problems.append(Problem(f.name, raw, option.allowed))
        if not problems:
            problems += _combination_problems(self)
        if problems:
            raise ConfigError(problems)

    # --- derived values (one place, so every front-end states the same numbers) -------

    @property
    def device_type(self) -> str:
        return hardware.inventory().resolve(self.accelerator)

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.accumulate_grad_batches * self.world_size

    @property
    def epochs_budget(self) -> int | None:
        if self.max_epochs is None and self.max_steps is None:
            return 1
        return self.max_epochs

    @property
    def pin(self) -> bool:
        # Pinning only helps copies to a CUDA device; elsewhere torch would warn and ignore it.
        return self.device_type == "cuda" and self.pin_memory is not False

    def lr_factor(self) -> float:
        """How much the base learning rate is multiplied by for this global batch."""
        if self.scale_lr == "none":
            return 1.0
        ratio = self.global_batch_size / self.base_batch_size
        return ratio if self.scale_lr == "linear" else math.sqrt(ratio)

    # --- changes ----------------------------------------------------------------------

    def replace(self, **changes) -> "TrainConfig":
        """A new config with `changes` applied, validated again; what was given stays given."""
        _check_names(changes)
        new = dataclasses.replace(self, **changes)
        object.__setattr__(new, "_given", self.given | frozenset(changes))
        return new

    @property
    def given(self) -> frozenset:
        """The options set on purpose (a keyword, a flag, a `replace`), even where the value equals the
        default: an explicit batch_size=32 is the user's word, which a DataLoader's 64 must not overrule."""
        return self.__dict__.get("_given", frozenset())

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        _check_names(values)
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def given_dict(self) -> dict:
        """The options given on purpose, with their values: this config as the user wrote it."""
        return {name: getattr(self, name) for name in option_names() if name in self.given}

    def changed_from(self, other: "TrainConfig") -> dict:
        """The options whose values differ from `other`, as {name: (old, new)}."""
        return {f.name: (getattr(other, f.name), getattr(self, f.name))
                for f in dataclasses.fields(self) if getattr(other, f.name) != getattr(self, f.name)}

    # --- settings as code ---------------------------------------------------------------

    def as_flags(self) -> str:
        """The `%%nbtrain` line that gives these settings (options left at their defaults omitted)."""
        words = ["%%nbtrain"]
        for name, (_, value) in self.changed_from(TrainConfig()).items():
            text = "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
            words += ["--" + name.replace("_", "-"), shlex.quote(text)]
        return " ".join(words)

    def as_code(self) -> str:
        """A `TrainConfig(...)` expression that gives these settings."""
        changed = self.changed_from(TrainConfig())
        return "TrainConfig(" + ", ".join(f"{name}={value!r}" for name, (_, value) in changed.items()) + ")"


def _recording_given(init):
    """TrainConfig's __init__, also recording which options the caller named (see `TrainConfig.given`)."""
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        named = frozenset(option_names()[:len(args)]) | frozenset(kwargs)
        object.__setattr__(self, "_given", named)  # not a field: equality, repr and to_dict are the values'
    __init__.__doc__, __init__.__wrapped__ = init.__doc__, init
    return __init__


TrainConfig.__init__ = _recording_given(TrainConfig.__init__)


def option_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def options() -> dict[str, tuple[Option, Any]]:
    """Every option with its reading rules and default, in declaration order."""
    return {f.name: (f.metadata["option"], f.default) for f in dataclasses.fields(TrainConfig)}


def _check_names(values: dict) -> None:
    known = option_names()
    problems = []
    for name in values:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            problems.append(Problem(name, values[name], f"unknown option; {hint}known options: {', '.join(known)}"))
    if problems:
        raise ConfigError(problems)


def check_runnable(c: TrainConfig, inv: hardware.Inventory | None = None) -> None:
    """Raise ConfigError when the target (this machine by default; a SLURM partition's nodes) cannot run `c`.

    Apart from TrainConfig's own value checks: a config made on a laptop for GPU nodes is a valid
    config; it is only not runnable *here*. Every run checks its target when it starts.
    """
    problems = runnable_problems(c, inv or hardware.inventory())
    if problems:
        raise ConfigError(problems)


def runnable_problems(c: TrainConfig, inv: hardware.Inventory) -> list[Problem]:
    """What the target with inventory `inv` cannot run of `c`."""
    out: list[Problem] = []
    device = inv.resolve(c.accelerator)
    if c.accelerator not in ("auto", "cpu") and c.accelerator not in inv.accelerators():
        out.append(Problem("accelerator", c.accelerator,
                           f"not available on this machine; available: {', '.join(inv.accelerators())}"))
        return out
    if c.precision == "16-mixed" and device != "cuda":
        out.append(Problem("precision", c.precision,
                           f"16-mixed needs a CUDA GPU (it uses a GradScaler); on {device} use 32-true or bf16-mixed"))
    if c.precision == "bf16-mixed" and device == "cuda" and not inv.cuda_bf16:
        out.append(Problem("precision", c.precision, "this GPU has no bf16 support; use 16-mixed or 32-true"))
    if device == "cuda" and c.devices > inv.cuda_devices:
        out.append(Problem("devices", c.devices, f"at most {inv.cuda_devices} (CUDA devices on this machine)"))
    if device != "cuda" and c.devices > inv.cpu_cores:
        out.append(Problem("devices", c.devices, f"at most {inv.cpu_cores} CPU processes (cores on this machine)"))
    if device == "mps" and c.devices > 1:
        out.append(Problem("devices", c.devices, "MPS runs one process; use devices=1"))
    if c.strategy == "dp" and (device != "cuda" or inv.cuda_devices < 2):
        out.append(Problem("strategy", c.strategy,
                           f"DataParallel needs at least 2 CUDA devices; this machine has {inv.cuda_devices}; use ddp"))
    return out


def _combination_problems(c: TrainConfig) -> list[Problem]:
    """Value checks that involve several options (never the hardware)."""
    out: list[Problem] = []
    if c.strategy == "dp" and c.num_nodes > 1:
        out.append(Problem("strategy", c.strategy, "DataParallel runs on one machine; use ddp with num_nodes > 1"))
    if c.strategy == "fsdp":
        out += _fsdp_problems(c)
    if c.node_rank is not None and c.node_rank >= c.num_nodes:
        out.append(Problem("node_rank", c.node_rank, f"a whole number from 0 to {c.num_nodes - 1} (this machine's "
                                                     f"place among num_nodes={c.num_nodes})"))
    if c.scale_lr != "none" and c.base_batch_size is None:
        out.append(Problem("scale_lr", c.scale_lr,
                           "needs base_batch_size (the global batch the learning rate was tuned for)"))
    if (c.patience is not None or c.restore_best) and c.monitor is None:
        out.append(Problem("patience" if c.patience is not None else "restore_best",
                           c.patience if c.patience is not None else True,
                           "needs monitor (the held-out number to watch, e.g. monitor='val_loss')"))
    if c.num_workers == 0 and c.persistent_workers:
        out.append(Problem("persistent_workers", True, "needs num_workers >= 1"))
    if c.num_workers == 0 and c.prefetch_factor is not None:
        out.append(Problem("prefetch_factor", c.prefetch_factor, "needs num_workers >= 1"))
    return out


def _fsdp_problems(c: TrainConfig) -> list[Problem]:
    out = []
    if c.world_size < 2:
        out.append(Problem("strategy", c.strategy, "fsdp shards the model over >= 2 processes; devices x num_nodes "
                                                   f"is {c.world_size}: set devices=2 or more, or use strategy=auto"))
    for option in ("checkpoint_every", "resume"):
        if getattr(c, option) is not None:
            out.append(Problem(option, getattr(c, option), "None with strategy=fsdp (checkpoints hold one "
                                                           "process's full weights; use ddp to checkpoint)"))
    return out
