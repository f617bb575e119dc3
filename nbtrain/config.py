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
from .monitored import AUTO_NOTE
from .options import ATOMS, ConfigError, Option, Problem, Reject, flag_name, setting

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")
_PRECISION_ALIASES = {
    "32": "32-true", "32-true": "32-true", "fp32": "32-true",
    "16": "16-mixed", "16-mixed": "16-mixed", "fp16": "16-mixed",
    "bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed",
}
ACCELERATORS = ("auto", "cpu", "cuda", "mps")
STRATEGIES = ("auto", "ddp", "dp", "fsdp")
LAUNCHERS = ("local", "torchrun", "slurm", "ray", "debug")  # where ranks run: nbtrain/distributed/launchers/<name>.py
DEFAULT_TIMEOUT_S = 1800.0  # torch's own default for a collective
LR_RULES = ("none", "linear", "sqrt")
SCHEDULE_COUNTS = ("steps", "samples")  # what a schedule stepped every step counts under a changed global batch
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
MATMUL_PRECISIONS = ("highest", "high", "medium")
OPTIMIZER_IMPLS = ("auto", "for-loop", "foreach", "fused")
GIVEN_KEY = "_given"  # in a kept config (to_record): the options given on purpose; never an option's name
MAX_BATCH = 2**24
MAX_WORKERS = 256
MAX_THREADS = 1024



@dataclass(frozen=True)
class TrainConfig:
    """How to train: device, precision, loader, batch, accumulation, budget, learning rate."""

    accelerator: str = setting("auto", "choice", "device type; auto picks cuda, then mps, then cpu",
                               allowed="one of auto, cpu, cuda (or gpu), mps", choices=ACCELERATORS,
                               aliases={"gpu": "cuda"})
    devices: int = setting(1, "whole", "processes per node; more than 1 launches DDP workers", low=1)
    num_nodes: int = setting(1, "whole", "machines (multi-node DDP)", low=1)
    strategy: str = setting("auto", "choice", "multi-device strategy: ddp (default for devices > 1), fsdp (shard a "
                            "model too big for one device) or dp (DataParallel, for comparison)", choices=STRATEGIES)
    launcher: str | None = setting(None, "choice", "where the ranks run: local (forked on this machine), torchrun "
                                   "(c10d across machines), slurm (a batch job), ray (the Ray cluster the kernel is "
                                   "attached to) or debug (rank 0 alone, in this process: pdb steps into it)",
                                   choices=LAUNCHERS, nullable=True,
                                   none="local for one node, torchrun for several")
    node_rank: int | None = setting(None, "whole", "this machine's place among num_nodes (multi-node)",
                                    low=0, nullable=True, none="$NBTRAIN_NODE_RANK")
    rdzv_endpoint: str | None = setting(None, "endpoint", "the c10d rendezvous every node reaches (multi-node)",
                                        allowed="'host:port' with a port from 1 to 65535 (e.g. 10.0.0.1:29400, "
                                                "[::1]:29400), or None ($NBTRAIN_RDZV_ENDPOINT)")
    rdzv_host: str | None = setting(None, "host", "address the ranks meet on (one machine) / this node's address "
                                    "(multi-node)", allowed="a host name or IP address of this machine, or None "
                                                            "(127.0.0.1)")
    find_unused_parameters: bool = setting(False, "switch", "DDP: allow parameters that take no part in a step's "
                                           "loss (DDP then looks for them after every forward, which costs time)")
    timeout: float | None = setting(None, "number", "how long a rank may wait in one collective before the run fails",
                                    above=0, cap=1e9, nullable=True, noun="a number of seconds",
                                    none=f"{DEFAULT_TIMEOUT_S:g}, torch's default")
    precision: str = setting("32-true", "choice", "numeric precision", choices=PRECISIONS, aliases=_PRECISION_ALIASES,
                             note="or 32, 16, bf16")
    batch_size: int = setting(32, "whole", "samples per batch, per process", low=1, high=MAX_BATCH)
    accumulate_grad_batches: int = setting(1, "whole", "micro-batches per optimizer step", low=1, cap=2**20)
    max_epochs: int | None = setting(None, "whole", "epochs to train in this run (default 1 when max_steps is unset)",
                                     low=1, nullable=True)
    max_steps: int | None = setting(None, "whole", "optimizer steps to train in this run", low=1, nullable=True,
                                    allowed="a whole number >= 1, or None / -1 for no step limit")
    max_time: float | None = setting(None, "number", "seconds of training in this run (engine/time_limit.py)",
                                     above=0, nullable=True, none="no time limit")
    num_workers: int = setting(0, "whole", "DataLoader worker processes", low=0, high=MAX_WORKERS)
    # torch's intra-op threads (torch.set_num_threads) while the run trains, put back after (engine/threads.py)
    num_threads: int | None = setting(None, "whole", "torch's CPU threads for the run's own work (intra-op); on a "
                                      "busy or small machine fewer threads can be much faster", low=1,
                                      high=MAX_THREADS, nullable=True,
                                      none="torch's own count; each DDP rank: the cores / its local ranks")
    pin_memory: bool | None = setting(None, "switch", "page-locked host batches for faster copies to the GPU",
                                      nullable=True, allowed="true, false or auto (pinned when training on CUDA)")
    persistent_workers: bool = setting(False, "switch", "keep loader workers alive between epochs",
                                       note="true needs num_workers >= 1")
    prefetch_factor: int | None = setting(None, "whole", "batches each worker loads ahead", low=1, high=1024,
                                          nullable=True, none="needs num_workers >= 1")
    shuffle: bool = setting(True, "switch", "reshuffle the training data every epoch")
    drop_last: bool = setting(False, "switch", "drop the last incomplete batch of an epoch")
    # Automatic by default: the batches are the DataLoader's, bit for bit (same sampler, seed and values),
    # so it changes what runs, never what is learned. When nbtrain may hold is one rule, stated in
    # engine/data.py: auto holds only a TensorDataset (or a Subset of one), whose samples are rows of its
    # tensors and nothing more; true also holds another Dataset, but only one whose samples are fixed
    # (reading them twice gives the same values, or it says so), never a random augmentation's one read.
    preload_data: bool | None = setting(None, "switch", "hold the training tensors in memory on the training device "
                                        "and cut each batch by index, in the DataLoader's order (no per-sample reads "
                                        "and collate); num_workers >= 1, a DataLoader's own sampler or samples that "
                                        "change at each read keep the DataLoader", nullable=True,
                                        allowed="true, false or auto (a TensorDataset, when num_workers=0 and it fits)")
    lr: float | None = setting(None, "number", "base learning rate (before scaling)", above=0, nullable=True,
                               none="keep the optimizer's own rate")
    scale_lr: str = setting("none", "choice", "scale the rate with global batch / base_batch_size", choices=LR_RULES)
    base_batch_size: int | None = setting(None, "whole", "the global batch the base learning rate was tuned for "
                                          "(scale_lr)", low=1, nullable=True)
    warmup_steps: int = setting(0, "whole", "linear warm-up over W steps (this value): step s (from 0) trains at (s+1)/W "
                                "of its rate (the scaled rate, or the schedule's), from 1/W at the first step to all "
                                "of it at step W", low=0)
    schedule_counts: str = setting("steps", "choice", "what a schedule stepped every step and warmup_steps count "
                                   "when the global batch differs from base_batch_size: steps, as written; or "
                                   "samples, laid over the samples base_batch_size's steps held (after step k the "
                                   "schedule has taken floor(k x global batch / base_batch_size) steps)",
                                   choices=SCHEDULE_COUNTS)
    gradient_clip_val: float | None = setting(None, "number", "clip the gradient norm to this value", above=0,
                                              nullable=True)
    seed: int | None = setting(0, "whole", "random seed (None: not seeded)", low=0, cap=2**63 - 1, nullable=True)
    compile: str = setting("none", "choice", "torch.compile the model (compile time is measured apart from step time)",
                           choices=COMPILE_MODES, note="or true / false",
                           aliases={"true": "default", "on": "default", "false": "none", "off": "none"})
    channels_last: bool = setting(False, "switch", "channels-last memory format for conv models and inputs")
    matmul_precision: str | None = setting(None, "choice", "float32 matmul precision on CUDA",
                                           choices=MATMUL_PRECISIONS, nullable=True, note="TF32 on Ampere+")
    cudnn_benchmark: bool | None = setting(None, "switch", "let cuDNN pick the fastest convolution algorithms",
                                           nullable=True, allowed="true, false or None (leave torch's setting)")
    optimizer_impl: str = setting("auto", "choice", "optimizer kernels: torch's default, per-tensor loop, foreach or "
                                  "fused", choices=OPTIMIZER_IMPLS)
    activation_checkpointing: str | None = setting(None, "modules", "recompute these submodules' activations in "
                                                   "backward to save memory",
                                                   allowed="None, auto (every top-level block with parameters) or "
                                                           "submodule names separated by commas")
    checkpoint_every: str | None = setting(None, "every", "write a checkpoint this often (atomically)",
                                           allowed="N optimizer steps, a duration such as 90s / 10m / 1h, or None")
    checkpoint_dir: str | None = setting(None, "path", "where checkpoints are written",
                                         allowed="a folder path, or None (.nbtrain/checkpoints)")
    resume: str | None = setting(None, "path", "continue a run from a checkpoint",
                                 allowed="a checkpoint file, 'last' (newest in checkpoint_dir), or None")
    on_nonfinite_loss: str = setting("stop", "choice", "stop (naming the step) when the loss becomes NaN/inf, or "
                                     "continue", choices=("stop", "continue"))
    val_every_n_steps: int | None = setting(None, "whole", "how often the held-out data is evaluated", low=1,
                                            nullable=True, none="at the end of each epoch")
    monitor: str | None = setting(None, "text", "what early stopping and restore_best watch",
                                  allowed="a held-out number such as val_loss, val_acc or val_<metric>, or None")
    mode: str = setting("auto", "choice", "whether the monitored number should go down (min) or up (max)",
                        choices=("auto", "min", "max"), note=AUTO_NOTE)
    patience: int | None = setting(None, "whole", "stop after this many validations without improvement of "
                                   "`monitor`", low=1, nullable=True, none="no early stopping")
    restore_best: bool = setting(False, "switch", "at the end, put back the weights of the best validation of "
                                 "`monitor`")
    logger: str = setting("none", "choice", "also write the run's metrics for TensorBoard or as CSV files (rank 0 "
                          "only)", choices=("none", "tensorboard", "csv"))
    logger_dir: str | None = setting(None, "path", "where the logger writes (a folder per run)",
                                     allowed="a folder path, or None (.nbtrain/logs)")
    log_every_n_steps: int = setting(10, "whole", "read losses back from the device every N optimizer steps", low=1)

    def __post_init__(self):
        problems: list[Problem] = []
        for f in dataclasses.fields(self):
            option: Option = f.metadata["option"]
            raw = getattr(self, f.name)
            if f.name == "max_steps" and raw in (-1, "-1"):
                raw = None
            try:
                object.__setattr__(self, f.name, option.read(raw))
            except Reject:
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

    @classmethod
    def with_options(cls, **options) -> "TrainConfig":
        """TrainConfig().replace(**options), made once: an unknown name refused with its nearest, the names given."""
        _check_names(options)
        return cls(**options)

    @property
    def given(self) -> frozenset:
        """The options set on purpose (a keyword, a flag, a `replace`), even where the value equals the
        default: an explicit batch_size=32 is the user's word, which a DataLoader's 64 must not overrule."""
        return self.__dict__.get("_given", frozenset())

    @classmethod
    def from_dict(cls, values: dict, given=None) -> "TrainConfig":
        """The config of `values`; `given` names those set on purpose (all of them unless it says)."""
        _check_names(values)
        config = cls(**values)
        if given is not None:
            object.__setattr__(config, "_given", frozenset(given) & frozenset(values))
        return config

    @classmethod
    def of(cls, config) -> "TrainConfig | None":
        """A `config=` argument as a TrainConfig: one, a dict of options (every one of them given), or None."""
        if config is None or isinstance(config, cls):
            return config
        if isinstance(config, dict):
            return cls.from_dict(config)
        raise ConfigError([Problem("config", config, "a TrainConfig, a dict of options "
                                   "(e.g. {'max_steps': 5}) or None")])

    def to_dict(self) -> dict:
        values = {name: getattr(self, name) for name in _OPTION_NAMES}
        # Every option reads as a number, a string, a bool or None: the values are asdict's, without its deep
        # copy of each (~0.1 ms of every run's start); anything else takes asdict's own path
        if all(type(value) in ATOMS for value in values.values()):
            return values
        return dataclasses.asdict(self)

    def to_record(self) -> dict:
        """The values and, under GIVEN_KEY, the options given on purpose: the config as a run directory and
        the run store keep it (JSON), so a run's settings as code state what it was given."""
        return {**self.to_dict(), GIVEN_KEY: sorted(self.given)}

    @classmethod
    def from_record(cls, record: dict) -> "TrainConfig":
        """The config `to_record` kept; options no longer known are dropped, and a record from before the
        given options were kept counts those that differ from the defaults as given (what it stated then)."""
        values = {name: value for name, value in record.items() if name in cls.__dataclass_fields__}
        given = record.get(GIVEN_KEY)
        if given is None:
            given = cls.from_dict(values).changed_from(cls())
        return cls.from_dict(values, given=given)

    def given_dict(self) -> dict:
        """The options given on purpose, with their values: this config as the user wrote it."""
        return {name: getattr(self, name) for name in option_names() if name in self.given}

    def changed_from(self, other: "TrainConfig") -> dict:
        """The options whose values differ from `other`, as {name: (old, new)}."""
        return {f.name: (getattr(other, f.name), getattr(self, f.name))
                for f in dataclasses.fields(self) if getattr(other, f.name) != getattr(self, f.name)}

    # --- settings as code ---------------------------------------------------------------

    def stated(self) -> dict:
        """The options this config states, in declaration order: those that differ from the defaults and
        those given on purpose at their default (an explicit batch_size=32 over a DataLoader's 64)."""
        defaults = TrainConfig()
        return {name: getattr(self, name) for name in option_names()
                if name in self.given or getattr(self, name) != getattr(defaults, name)}

    def as_flags(self) -> str:
        """The `%%nbtrain` line that gives these settings (`stated`: options neither given nor changed left out)."""
        words = ["%%nbtrain"]
        for name, value in self.stated().items():
            flag, text = flag_name(name), _flag_text(name, value)
            # A value that starts with '-' would read as a flag: it goes after '='.
            words += [f"{flag}={shlex.quote(text)}"] if text.startswith("-") else [flag, shlex.quote(text)]
        return " ".join(words)

    def as_code(self) -> str:
        """A `TrainConfig(...)` expression that gives these settings (`stated`), the same options given."""
        return "TrainConfig(" + ", ".join(f"{name}={value!r}" for name, value in self.stated().items()) + ")"


def _flag_text(name: str, value) -> str:
    """`value` as a flag's text that reads back as it: None as the word its option reads as None ('none'),
    or as '' where 'none' is a text of its own (a path or name)."""
    if value is None:
        return "none" if options()[name][0].read("none") is None else ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _recording_given(init):
    """TrainConfig's __init__, also recording which options the caller named (see `TrainConfig.given`)."""
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        named = frozenset(_OPTION_NAMES[:len(args)]) | frozenset(kwargs)
        object.__setattr__(self, "_given", named)  # not a field: equality, repr and to_dict are the values'
    __init__.__doc__, __init__.__wrapped__ = init.__doc__, init
    return __init__


TrainConfig.__init__ = _recording_given(TrainConfig.__init__)


_OPTION_NAMES = tuple(f.name for f in dataclasses.fields(TrainConfig))  # declared once, read at every config made
_KNOWN = frozenset(_OPTION_NAMES)


def option_names() -> list[str]:
    return list(_OPTION_NAMES)


def options() -> dict[str, tuple[Option, Any]]:
    """Every option with its reading rules and default, in declaration order."""
    return {f.name: (f.metadata["option"], f.default) for f in dataclasses.fields(TrainConfig)}


def _check_names(values: dict) -> None:
    if _KNOWN.issuperset(values):
        return
    known = option_names()
    problems = []
    for name in values:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            problems.append(Problem(name, values[name], f"unknown option; {hint}known options: {', '.join(known)}"))
    if problems:
        raise ConfigError(problems)


def check_runnable(c: TrainConfig, inv: hardware.Inventory | None = None, where: str = "this machine") -> None:
    """Raise ConfigError when the target (this machine by default; a launcher target's inventory, named
    `where`: a SLURM partition's nodes, a Ray cluster) cannot run `c`.

    Apart from TrainConfig's own value checks: a config made on a laptop for GPU nodes is a valid
    config; it is only not runnable *here*. Every run checks its target when it starts.
    """
    problems = runnable_problems(c, inv or hardware.inventory(), where)
    if problems:
        raise ConfigError(problems)


def runnable_problems(c: TrainConfig, inv: hardware.Inventory, where: str = "this machine") -> list[Problem]:
    """What the target with inventory `inv` (named `where` in the problems) cannot run of `c`."""
    out: list[Problem] = []
    device = inv.resolve(c.accelerator)
    if c.accelerator not in ("auto", "cpu") and c.accelerator not in inv.accelerators():
        out.append(Problem("accelerator", c.accelerator,
                           f"not available on {where}; available: {', '.join(inv.accelerators())}"))
        return out
    if c.precision == "16-mixed" and device != "cuda":
        out.append(Problem("precision", c.precision,
                           f"16-mixed needs a CUDA GPU (it uses a GradScaler); on {device} use 32-true or bf16-mixed"))
    if c.precision == "bf16-mixed" and device == "cuda" and not inv.cuda_bf16:
        out.append(Problem("precision", c.precision, "this GPU has no bf16 support; use 16-mixed or 32-true"))
    if device == "cuda" and c.devices > inv.cuda_devices:
        out.append(Problem("devices", c.devices, f"at most {inv.cuda_devices} (CUDA devices on {where})"))
    if device != "cuda" and c.devices > inv.cpu_cores:
        out.append(Problem("devices", c.devices, f"at most {inv.cpu_cores} CPU processes (cores on {where})"))
    if device == "mps" and c.devices > 1:
        out.append(Problem("devices", c.devices, "MPS runs one process; use devices=1"))
    if c.strategy == "dp" and (device != "cuda" or inv.cuda_devices < 2):
        out.append(Problem("strategy", c.strategy,
                           f"DataParallel needs at least 2 CUDA devices; {where} has {inv.cuda_devices}; use ddp"))
    return out


def _combination_problems(c: TrainConfig) -> list[Problem]:
    """Value checks that involve several options (never the hardware)."""
    out: list[Problem] = []
    if c.strategy == "dp" and c.num_nodes > 1:
        out.append(Problem("strategy", c.strategy, "DataParallel runs on one machine; use ddp with num_nodes > 1"))
    if c.strategy == "fsdp":
        out += _fsdp_problems(c)
    if c.launcher == "local" and c.num_nodes > 1:
        out.append(Problem("launcher", c.launcher, f"torchrun, slurm or ray with num_nodes={c.num_nodes} (local "
                                                   "starts one machine's ranks)"))
    if c.launcher == "debug" and c.world_size > 1:
        out.append(Problem("launcher", c.launcher, f"local, torchrun, slurm or ray with devices x num_nodes = "
                                                   f"{c.world_size} (debug runs rank 0 alone, in this process)"))
    if c.node_rank is not None and c.node_rank >= c.num_nodes:
        out.append(Problem("node_rank", c.node_rank, f"a whole number from 0 to {c.num_nodes - 1} (this machine's "
                                                     f"place among num_nodes={c.num_nodes})"))
    if c.scale_lr != "none" and c.base_batch_size is None:
        out.append(Problem("scale_lr", c.scale_lr,
                           "needs base_batch_size (the global batch the learning rate was tuned for)"))
    if c.schedule_counts == "samples" and c.base_batch_size is None:
        out.append(Problem("schedule_counts", c.schedule_counts,
                           "needs base_batch_size (the global batch the schedule's steps were written for)"))
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
