"""A code object is read once: it cannot change, so its disassembly is kept while it lives; what a function
reads now (its globals' values) is still read at every look."""
import dis
import gc
import sys

from nbtrain.engine import observed

FACTOR = 0.8


def _scaled(x):
    return x * FACTOR


def test_a_code_object_is_disassembled_once_and_a_global_it_reads_is_read_at_every_look(monkeypatch):
    looks = []
    real = dis.get_instructions
    monkeypatch.setattr(observed.dis, "get_instructions", lambda code: looks.append(code) or real(code))
    monkeypatch.setattr(observed, "_READ_CODE", type(observed._READ_CODE)())
    before = observed.Value(_scaled)
    monkeypatch.setattr(sys.modules[__name__], "FACTOR", 0.5)
    now = observed.Value(_scaled)
    assert looks == [_scaled.__code__]
    assert before != now and observed.Value(_scaled) == now


def test_a_code_objects_reading_goes_with_it():
    namespace = {}
    exec("def f(x):\n    return x + OFFSET\n", namespace)
    observed.Value(namespace["f"])
    kept = len(observed._READ_CODE)
    del namespace
    gc.collect()
    assert len(observed._READ_CODE) < kept
