"""The workload digest, one idea: one walk over what a run trains, its fast paths beside the readings they restate.

What a run trains beyond its config, as one digest: two runs with the same digest and the same config ran
the same code on the same shapes as far as nbtrain can read, so a difference in their speed may be the
machine's (runs/repeats.py, where an observed difference too wide for the machine still wins over it).

The digest is of what decides a step's work, read rather than named:
- the model's modules, their parameter shapes, the hooks on them (and torch's global module and optimizer
  hooks), and every attribute a user's module keeps, followed into the objects it holds (a dataclass config);
- the user's own code (forward, training_step, loss, collate_fn, the optimizer's factory, a dataset's
  methods): its bytecode, and the values of the globals it names and of its closures and defaults,
  followed into the functions, classes and objects those hold;
- the data: its length, tensor shapes and dtypes, and a dataset's attributes, followed as a module's;
- the process-wide settings a step runs under: torch's thread counts, anomaly mode, deterministic
  algorithms, matmul precision, cuDNN and other backend flags, a tracer or profiler in Python.
Bytecode, not source: a class defined in a notebook cell has no file to read, and an edit that changes what
runs changes its bytecode. Tensor values are not work (two data sets of random numbers train alike); their
shapes, dtypes, devices and layouts are. A library's code (torch, numpy, anything installed) is its
version's; its objects are read by their public attributes. Where a part cannot be read (an object with no
attributes to read and no known kind, a graph too large to follow), the digest is None: unknown, never
"the same settings".

A run reads its digest at every call, so a data set's thousands of rows are read fast: an exact dict of string
keys by `_Reader._dict`, which adds the parts the general reading (`_follow`) would, and a run of items that read
alike as one reading and a count (`_Reader._items`); rows that all read alike are checked column by column in C
loops (`_Reader._alike_rows`, ~0.3 us a row), adding the parts the row-by-row reading would. The readings stay in
this module so they cannot drift; tests/test_workload_rows.py holds them equal over generated data sets.
"""
from __future__ import annotations

import collections
import dis
import enum
import functools
import hashlib
import importlib
import io
import itertools
import operator
import pathlib
import random
import re
import sys
import sysconfig
import types
import weakref

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from . import walks
from ..slots import Slot
from ..version import __version__ as nbtrain_version  # the engine's own code: its version's

_OURS = ("torch", "builtins", "nbtrain", "functools", "lightning", "pytorch_lightning", "torchvision")
_LIBRARY_DIRS = tuple(p for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
                      if p)
MAX_NODES = 200_000  # objects followed before the digest gives up (unknown): a run's start stays quick
MAX_DEPTH = 60       # objects nested deeper than this are not followed: unknown

_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # every module's own bookkeeping (its parameters, hooks, ...)
_MODULE_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks",
                 "_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
_HOOK_NAMES = frozenset(_MODULE_HOOKS)
_GLOBAL_HOOKS = ((nn.modules.module, ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                                      "_global_backward_hooks", "_global_forward_hooks_with_kwargs",
                                      "_global_forward_hooks_always_called")),
                 (importlib.import_module("torch.optim.optimizer"), ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")))
_ATOMS = (type(None), bool, int, float, complex, str, bytes)
_ATOM_TYPES = frozenset(_ATOMS)  # exactly these (an IntEnum is an int whose class may be the user's)
_NAMED = (torch.dtype, torch.device, torch.layout, torch.memory_format, np.dtype, re.Pattern, pathlib.PurePath)
_DESCRIPTORS = (types.MemberDescriptorType, types.GetSetDescriptorType)  # a slot's: its value is the instance's
# A tensor's reading's parts beside its contiguity, one definition for its reading (_Reader._tensor_reading) and
# for a data set's column of exact tensors read in C loops (_Reader._alike_rows): a part added here is in both
_TENSOR_KIND = operator.attrgetter("shape", "dtype", "device", "layout", "requires_grad")
_RANDOM = (torch.Generator, np.random.Generator, np.random.RandomState, np.random.BitGenerator, random.Random)


class Unreadable(Exception):
    """A part of the workload nbtrain cannot put in the digest."""


def digest(recipe, model: nn.Module | None = None) -> str | None:
    """A digest of what `recipe` trains (its model: `model` where the engine wrapped or moved it) under this
    process's settings, or None where a part cannot be read."""
    reader = _Reader()
    try:
        reader.add(process_settings())
        reader.module(model if model is not None else recipe.model)
        for name in ("loss_fn", "training_step", "optimizer", "collate_fn", "scheduler", "validation_step", "metrics"):
            reader.add(name)
            reader.value(getattr(recipe, name, None))
        for name in ("train_data", "val_data", "fixed_loader"):
            reader.add(name)
            reader.data(getattr(recipe, name, None))
        reader.value(getattr(recipe, "loader_settings", None))  # a given DataLoader's batch, workers
        for module, names in _GLOBAL_HOOKS:
            for name in names:
                reader.hooks(name, getattr(module, name, None))
    except Exception:  # Unreadable, or a user's object that fails to say its length or repr: no digest, no run lost
        return None
    return hashlib.sha256(repr(reader.parts).encode()).hexdigest()[:16]


def process_settings() -> tuple:
    """What the process runs every step under, beyond the run's config: threads, autograd's modes, the
    backends' flags, a tracer (a debugger, coverage) slowing Python."""
    backends = torch.backends
    flags = {"torch": torch.__version__, "nbtrain": nbtrain_version, "threads": torch.get_num_threads(),
             "interop_threads": torch.get_num_interop_threads(),
             "anomaly": (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
             "deterministic": (torch.are_deterministic_algorithms_enabled(),
                               torch.is_deterministic_algorithms_warn_only_enabled()),
             "matmul_precision": torch.get_float32_matmul_precision(), "default_dtype": str(torch.get_default_dtype()),
             "profiler": getattr(torch.autograd, "_profiler_enabled", lambda: "absent")(),  # torch.profiler on
             "tracer": type(sys.gettrace()).__qualname__, "profile": type(sys.getprofile()).__qualname__}
    for path, names in (("cudnn", ("enabled", "benchmark", "deterministic", "allow_tf32")),
                        ("cuda.matmul", ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                                         "allow_bf16_reduced_precision_reduction")),
                        ("mkldnn", ("enabled",)), ("opt_einsum", ("enabled",))):
        owner = functools.reduce(lambda o, part: getattr(o, part, None), path.split("."), backends)
        for name in names:
            flags[f"{path}.{name}"] = repr(getattr(owner, name, "absent"))
    for name in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled"):
        flags[name] = getattr(backends.cuda, name, lambda: "absent")()
    return tuple(sorted(flags.items()))


@functools.lru_cache(maxsize=None)
def _library_module(name: str) -> bool:
    """Whether module `name` is a library's (nbtrain, torch, Python's own, anything installed), whose code is
    its version's, rather than the user's (a notebook's __main__, a script, a file of their project)."""
    top = name.split(".")[0]
    if top in ("__main__", "__mp_main__"):  # a notebook's or a script's own code, whatever runs it
        return False
    if top in _OURS or top in sys.stdlib_module_names:
        return True
    file = getattr(sys.modules.get(top), "__file__", None) or ""
    return any(part in file for part in ("site-packages", "dist-packages")) or \
        any(file.startswith(d) for d in _LIBRARY_DIRS)


def _library(obj) -> bool:
    return _library_module(getattr(obj, "__module__", None) or "__main__")  # no module: code made by exec


def _qualname(obj) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


class _Reader:
    """Follows a workload's objects into `parts`; an object met again is a reference to where it was first
    read (cycles, and one config shared by model and data), so the walk ends and stays deterministic."""

    def __init__(self):
        self.parts: list = []
        self.seen: dict[int, int] = {}
        self.alive: list = []  # what `seen` names by id stays alive (no id reused during the walk)
        self.tensors: dict[int, tuple] = {}  # id -> a tensor's reading, this walk
        self.depth = 0

    def add(self, part) -> None:
        self.parts.append(part)

    def first_time(self, obj) -> bool:
        """Whether `obj` is read here for the first time (else a reference to its first reading is added)."""
        if id(obj) in self.seen:
            self.add(("seen", self.seen[id(obj)]))
            return False
        if len(self.seen) >= MAX_NODES:
            raise Unreadable(f"more than {MAX_NODES} objects")
        self.seen[id(obj)] = len(self.seen)
        self.alive.append(obj)
        return True

    def value(self, value) -> None:
        kind = type(value)
        # The kinds a data set's rows are made of first, by exact type (the same reading as below): a list of
        # 50,000 dict rows is read once per call, so each row must not try every kind in turn (~6 us a row)
        if kind in _ATOM_TYPES:
            self.add(value)
        elif kind is torch.Tensor or kind is nn.Parameter:
            self._tensor(value)
        elif kind is dict:
            self._dict(value)
        elif self._met_before(value, kind):
            self.parts.append(("seen", self.seen[id(value)]))
        elif isinstance(value, _ATOMS):
            self.add(value)
        elif isinstance(value, enum.Enum) or isinstance(value, _NAMED):
            self.add(repr(value))
        elif isinstance(value, torch.Tensor):
            self._tensor(value)
        elif isinstance(value, np.ndarray):
            self.add(("ndarray", value.shape, str(value.dtype), value.flags.c_contiguous))
        elif isinstance(value, np.generic):
            self.add(repr(value))
        elif isinstance(value, _RANDOM):  # its state is the values it draws, not work
            self.add((_qualname(type(value)), str(getattr(value, "device", ""))))
        elif isinstance(value, type):
            self.klass(value)
        elif isinstance(value, nn.Module):
            self.module(value)
        elif isinstance(value, Slot):  # nbtrain's own state kept on a user's module (its live engine): not theirs
            self.add("nbtrain's slot")
        elif (plain := _plain_repr(value)) is not None:  # a list of paths or labels: one repr, not an object each
            self.add(plain)
        else:
            self._follow(value)

    def _met_before(self, value, kind: type) -> bool:
        """Whether `value` was read before in this walk, so that its reading is the reference its kind's branch
        adds again (a model's config held by each of its blocks), without asking its kind again (~25 isinstance
        checks through a slow __getattribute__, for a Hugging Face config). Only what is followed, a module and
        an exact dict are in `seen`, each by the branch its type always takes; a class (whatever its
        metaclass) adds its name before its reference (klass), so it is asked again."""
        return id(value) in self.seen and not issubclass(kind, type)

    def _tensor(self, value: torch.Tensor) -> None:
        self.parts.append(self.tensors.get(id(value)) or self._tensor_reading(value))

    def _tensor_reading(self, value: torch.Tensor) -> tuple:
        # One reading per tensor object in a walk (a row's labels are often its input_ids): nothing runs
        # between two readings of it in one walk, and `alive` keeps its id from naming another tensor.
        shape, dtype, device, layout, requires_grad = _TENSOR_KIND(value)
        reading = self.tensors[id(value)] = ("tensor", tuple(shape), *_kind_text(dtype, device, layout),
                                             value.is_contiguous(), requires_grad)
        self.alive.append(value)
        return reading

    def _dict(self, value: dict) -> None:
        """An exact dict: _follow's reading of it (the same parts), in fewer calls: a data set's rows are
        thousands of dicts, read at every call (first_time, _follow and _sorted_items written out here)."""
        seen, key = self.seen, id(value)
        if key in seen:
            self.parts.append(("seen", seen[key]))
            return
        if len(seen) >= MAX_NODES:
            raise Unreadable(f"more than {MAX_NODES} objects")
        seen[key] = len(seen)
        self.alive.append(value)
        if self.depth >= MAX_DEPTH:
            raise Unreadable("nested too deep")
        keys = tuple(value)
        order = _str_key_order(keys, tuple(map(type, keys)))  # _sorted_items' order, once per set of keys
        if order is None:  # keys that are not all strings: the general reading
            self._follow_unseen(value)
            return
        self.depth += 1
        try:
            add, tensors = self.parts.append, self.tensors
            add(("builtins.dict", len(keys)))
            for key in order:
                add(key)
                item = value[key]
                kind = type(item)
                if kind is torch.Tensor or kind is nn.Parameter:
                    add(tensors.get(id(item)) or self._tensor_reading(item))
                elif kind in _ATOM_TYPES:
                    add(item)
                else:
                    self.value(item)
        finally:
            self.depth -= 1

    def _follow(self, value) -> None:
        """An object read into its parts, once (a reference where it was met before)."""
        if self.first_time(value):
            self._follow_unseen(value)

    def _follow_unseen(self, value) -> None:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise Unreadable("nested too deep")
            self._object(value)
        finally:
            self.depth -= 1

    def _object(self, value) -> None:
        if isinstance(value, (tuple, list, collections.deque)):
            self.add((type(value).__name__, len(value)))
            self._items(value)
        elif isinstance(value, dict):
            self.add((_qualname(type(value)), len(value)))
            for key, item in _sorted_items(value):
                self.value(key)
                self.value(item)
        elif isinstance(value, (set, frozenset)):
            self.add((type(value).__name__, sorted(_digest_of(item) for item in value)))
        elif isinstance(value, types.ModuleType):
            self.add(("module", value.__name__))
        else:
            self.callable_or_object(value)

    def _items(self, items) -> None:
        """A sequence's items in order, each run of items that read alike (a data set's rows of one shape) as
        its first reading and how many more read the same: the same information, hashed in a fraction of the
        time (a 3-tuple no other reading adds)."""
        if self._alike_rows(items):
            return
        self._items_one_by_one(items)

    def _alike_rows(self, items) -> bool:
        """`_items_one_by_one`'s parts for a data set whose rows all read alike, added column by column in C
        loops (a row's ~1.6 us becomes ~0.3): every item an exact dict, none met before, with the first's string
        keys in its order, each key's values exact tensors of one shape, dtype, device, layout, contiguity and
        requires_grad. False, with nothing added, where any of that does not hold: they are read one by one."""
        if len(items) < 2 or type(items[0]) is not dict:
            return False
        first, seen = items[0], self.seen
        ids = list(map(id, items))
        if set(map(type, items)) != {dict} or len(set(ids)) != len(ids) or not seen.keys().isdisjoint(ids):
            return False
        keys = tuple(first)  # a key equal to a string but of a str subclass is another key: every key's type is read
        if set(map(tuple, items)) != {keys} or set(map(type, itertools.chain.from_iterable(items))) != {str}:
            return False
        read = set()  # columns holding the same tensors as a column checked already (labels that are input_ids)
        for key in keys:
            column = list(map(operator.itemgetter(key), items))
            tensor_ids = tuple(map(id, column))
            if tensor_ids in read:
                continue
            if set(map(type, column)) != {torch.Tensor} or \
                    len(set(zip(map(_TENSOR_KIND, column), map(torch.Tensor.is_contiguous, column)))) != 1:
                return False
            read.add(tensor_ids)
        if len(seen) + len(items) > MAX_NODES:
            raise Unreadable(f"more than {MAX_NODES} objects")
        self._dict(first)  # the first row's reading, as one by one
        seen.update(zip(ids[1:], range(len(seen), len(seen) + len(ids) - 1)))
        self.alive.extend(items)
        self.parts.append(("repeats", "of the item before", len(items) - 1))
        return True

    def _items_one_by_one(self, items) -> None:
        parts, previous, repeats = self.parts, None, 0
        for item in items:
            start = len(parts)
            if type(item) is dict:
                self._dict(item)
            else:
                self.value(item)
            reading = parts[start:]
            if reading == previous:
                del parts[start:]
                repeats += 1
                continue
            if repeats:
                parts.insert(start, ("repeats", "of the item before", repeats))
            previous, repeats = reading, 0
        if repeats:
            parts.append(("repeats", "of the item before", repeats))

    def callable_or_object(self, value) -> None:
        if isinstance(value, types.FunctionType):
            self.code(value)
        elif isinstance(value, types.MethodType):
            self.value(value.__self__)
            self.value(value.__func__)
        elif isinstance(value, functools.partial):  # functools' own, but what it calls with is the user's
            self.value(value.func)
            self.value(value.args)
            self.value(value.keywords)
        elif isinstance(value, (types.BuiltinFunctionType, types.MethodWrapperType)):
            self.add(_qualname(value))  # a C function: its library's; a method of an object: that object too
            owner = getattr(value, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType):
                self.value(owner)
        elif isinstance(value, weakref.ref):
            self.value(value())
        elif isinstance(value, io.IOBase):
            raise Unreadable("a file: what it holds is outside the process")
        else:
            self.instance(value)

    def instance(self, obj) -> None:
        """A user's object (a dataclass config, a plain settings object): its class and every attribute; a
        library's: its class and public attributes (its private state is its version's implementation), or
        its repr where it keeps none."""
        kind, library = type(obj), _library(type(obj))
        self.klass(kind)
        attributes = _attributes(obj)
        if attributes is None:
            if library and callable(obj):
                self.add(_qualname(obj))  # a library's C callable: its version's
                return
            if library and (said := _repr_of(obj)):  # a C object whose repr says it
                self.add(said)
                return
            raise Unreadable(_qualname(kind))
        public = [pair for pair in attributes if not pair[0].startswith("_")] if library else attributes
        if library and not public:
            self.add(_repr_of(obj))  # a Path's private parts: its repr says them
        add = self.parts.append
        for name, item in public:  # a config's hundred settings: an atom added without value()'s call
            add(name)
            if type(item) in _ATOM_TYPES:
                add(item)
            else:
                self.value(item)

    def klass(self, kind: type) -> None:
        """A class: a library's by name; a user's by its methods' code and its class attributes, for every
        user class in its MRO."""
        self.add(_qualname(kind))
        if _library(kind):
            return
        for klass in kind.__mro__:
            if _library(klass) or not self.first_time(klass):
                continue
            for name, member in sorted(vars(klass).items()):
                function = getattr(member, "__func__", member)  # staticmethod, classmethod
                if isinstance(member, property):
                    self.add(name)
                    for accessor in (member.fget, member.fset):
                        self.value(accessor)
                elif isinstance(function, types.FunctionType):
                    self.add(name)
                    self.value(function)
                elif not (name.startswith("__") and name.endswith("__")) and not isinstance(member, _DESCRIPTORS):
                    self.add(name)  # a class setting (SCALE = 3) read as self.SCALE
                    self.value(member)

    def code(self, function: types.FunctionType) -> None:
        """A function: a library's by name; a user's by its bytecode, defaults, closure, and the values of
        the globals it names (a user module's: the attributes it names)."""
        if _library(function):
            self.add(_qualname(function))
            return
        names, attributes = _names(function.__code__)
        self.add(_code(function.__code__))
        self.value(function.__defaults__)
        self.value(function.__kwdefaults__)
        for cell in function.__closure__ or ():
            try:
                self.value(cell.cell_contents)
            except ValueError:  # an empty cell
                self.add(None)
        namespace = function.__globals__
        for name in sorted(names):
            if name in namespace:
                value = namespace[name]
                self.add(name)
                if isinstance(value, types.ModuleType) and not _library_module(value.__name__):
                    self.add(("module", value.__name__))  # a user's module: what the code reads of it
                    for attribute in sorted(attributes):
                        if attribute in vars(value):
                            self.add(attribute)
                            self.value(vars(value)[attribute])
                else:
                    self.value(value)

    def module(self, model: nn.Module) -> None:
        if not self.first_time(model):
            return
        add = self.parts.append
        add(repr(model))
        modules, parameters, buffers = walks.walked(model)
        add(tuple((name, tuple(p.shape), str(p.dtype), p.requires_grad) for name, p in parameters))
        add(tuple((name, tuple(b.shape), str(b.dtype)) for name, b in buffers))
        # Hooks where there are any, each named by its place (most modules and tensors have none: a GPT-2's
        # ~300 empty hook dicts read as one name each cost ~0.1 ms a call, and say nothing the names don't)
        for name, p in parameters:  # tensor hooks: p.register_hook, register_post_accumulate_grad_hook
            for kind in ("_backward_hooks", "_post_accumulate_grad_hooks"):
                if getattr(p, kind, None):
                    self.hooks(f"{name}:{kind}", getattr(p, kind))
        for name, module in modules:
            add(name)
            self.klass(type(module))
            own = vars(module)
            # the hook dicts Module.__init__ gave it, most of them empty, read at once (any missing: each read)
            if any(map(own.get, _MODULE_HOOKS)) or not _HOOK_NAMES <= own.keys():
                for hooks in _MODULE_HOOKS:
                    if own_hooks := getattr(module, hooks, None):
                        self.hooks(hooks, own_hooks)
            # a user's module: every setting it keeps (a wait, a dataclass config); torch's: its public ones
            library = _library(type(module))
            for attribute in sorted(own.keys() - _MODULE_INTERNALS):  # ~20 internals a module, set aside at once
                if not (library and attribute.startswith("_")):
                    add(attribute)
                    item = own[attribute]
                    if type(item) in _ATOM_TYPES:  # value()'s first branch, without its call (most settings)
                        add(item)
                    else:
                        self.value(item)

    def hooks(self, name: str, hooks) -> None:
        """A hooks dict's functions in order (their handles' ids differ run to run; their order does not)."""
        self.add(name)
        self.value(list(hooks.values()) if hooks else None)

    def data(self, data) -> None:
        if isinstance(data, DataLoader):
            self.add(("DataLoader", data.batch_size, data.num_workers, data.drop_last, data.pin_memory,
                      data.prefetch_factor, data.persistent_workers))
            for part in (data.collate_fn, data.worker_init_fn, data.batch_sampler, data.sampler):
                self.value(part)
            data = data.dataset
        if isinstance(data, TensorDataset):
            self.add(("TensorDataset", tuple((tuple(t.shape), str(t.dtype), str(t.device)) for t in data.tensors)))
            return
        if data is not None:
            if not hasattr(data, "__getitem__"):
                raise Unreadable(type(data).__name__)
            self.add(len(data) if hasattr(data, "__len__") else None)
        self.value(data)


@functools.lru_cache(maxsize=256)
def _kind_text(dtype: torch.dtype, device: torch.device, layout: torch.layout) -> tuple[str, str, str]:
    """A tensor's dtype, device and layout as text, once per kind (a data set's rows share a few)."""
    return str(dtype), str(device), str(layout)


def _attributes(obj) -> list[tuple[str, object]] | None:
    """An object's attributes, from its __dict__ and its slots, by name; None where it keeps neither."""
    own = getattr(obj, "__dict__", None)
    slots = [s for klass in type(obj).__mro__ for s in getattr(klass, "__slots__", ()) if isinstance(s, str)]
    if not isinstance(own, dict) and not slots:
        return None
    found = dict(own) if isinstance(own, dict) else {}
    for slot in slots:
        if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
            found[slot] = getattr(obj, slot)
    return sorted(found.items())


def _repr_of(obj) -> str:
    """A library object's own repr, '' where it has none or names only where the object lives."""
    if type(obj).__repr__ is object.__repr__:
        return ""
    said = repr(obj)
    return "" if " at 0x" in said else said


def _sorted_items(mapping: dict):
    """A dict's items, by key where its keys are plain (a config's order of writing is no setting)."""
    items = list(mapping.items())
    if all(isinstance(k, _ATOMS) for k in mapping):
        items.sort(key=lambda kv: (type(kv[0]).__name__, repr(kv[0])))
    return items


@functools.lru_cache(maxsize=256)
def _str_key_order(keys: tuple, kinds: tuple) -> tuple[str, ...] | None:
    """A dict's keys (of types `kinds`) in _sorted_items' order where they are all exactly strings (a data set's
    rows share one set of keys), else None. The types are part of the cache's key: a str subclass's key equal
    to a string must not be taken for one."""
    if not all(kind is str for kind in kinds):
        return None
    return tuple(sorted(keys, key=repr))


def _digest_of(value) -> str:
    """One set member's own reading, as text (a set's order is its hash's, which differs between processes)."""
    reader = _Reader()
    reader.value(value)
    return repr(reader.parts)


def _plain_repr(value):
    """A container made only of plain values (atoms, and tuples and lists of them), as its kind, length and
    a hash of its repr (a data set's 50,000 paths: one repr, not an object each); else None."""
    if type(value) not in (tuple, list) or not value:
        return None
    stack = [value]
    while stack:
        items = stack.pop()
        if all(type(item) in _ATOM_TYPES for item in items):
            continue
        for item in items:
            if type(item) in (tuple, list):
                stack.append(item)
            elif type(item) not in _ATOM_TYPES:
                return None
    return (type(value).__name__, len(value), hashlib.sha256(repr(value).encode()).hexdigest())


@functools.lru_cache(maxsize=4096)
def _names(code: types.CodeType) -> tuple[frozenset, frozenset]:
    """The global names a code object and the functions nested in it load, and the attribute names they
    read (`self.model` reads no global `model`: a notebook's `model` is not what that line reads)."""
    globals_, attributes = set(), set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            globals_.add(instruction.argval)
        elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM"):
            attributes.add(instruction.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            inner_globals, inner_attributes = _names(const)
            globals_ |= inner_globals
            attributes |= inner_attributes
    return frozenset(globals_), frozenset(attributes)


@functools.lru_cache(maxsize=4096)
def _code(code: types.CodeType):
    """A code object's instructions, names and constants, nested functions' too (no line numbers: a
    comment added above does not change what runs). Kept per code object: a code object never changes, and
    two that compare equal have the same instructions, names and constants, so the same reading."""
    return (code.co_code, code.co_names, code.co_varnames, tuple(_const(c) for c in code.co_consts))


def _const(const):
    if isinstance(const, types.CodeType):
        return _code(const)
    if isinstance(const, tuple):
        return tuple(_const(c) for c in const)
    if isinstance(const, frozenset):  # `x in {1, 2}`: sorted, as a set's order differs between processes
        return ("frozenset", tuple(sorted(repr(_const(c)) for c in const)))
    return repr(const)
