"""benchmarks.peers' opcode table: where nbtrain's call runs Python the plain loop does not, by function."""
import collections
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import peers  # noqa: E402


def _shared(n):
    total = 0
    for i in range(n):
        total += i
    return total


def _only_ours(n):
    return [i * 2 for i in range(n)]


def _peer():
    """A peer whose two sides share one function with the same work, and each has its own."""
    def plain(m):
        return _shared(50)

    def ours(m):
        _only_ours(30)
        dataclasses.replace(dataclasses.make_dataclass("Point", ["x"])(1), x=2)  # a standard-library function
        return _shared(50)
    return (lambda: torch.nn.Linear(1, 1)), plain, ours


def _opcodes(function, *args) -> int:
    count = [0]

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode" and frame.f_code is function.__code__:
            count[0] += 1
        return tracer
    sys.settrace(tracer)
    try:
        function(*args)
    finally:
        sys.settrace(None)
    return count[0]


def test_the_table_names_each_sides_own_functions_with_their_counts_and_cancels_what_both_run_alike():
    extra = peers.opcodes_by_function(_peer)
    assert extra["tests/test_peers_where.py:_only_ours"] == _opcodes(_only_ours, 30) > 0
    assert extra["tests/test_peers_where.py:_shared"] == 0  # the same work on both sides
    assert extra["tests/test_peers_where.py:plain"] < 0 < extra["tests/test_peers_where.py:ours"]
    assert extra["dataclasses.py:replace"] > 0  # the standard library's file, without its folder
    assert not [name for name in extra if name.startswith("/")]  # every name from its package or checkout
    assert peers.extra_opcodes(_peer) == sum(extra.values())


def test_the_printed_table_leads_with_the_largest_differences_either_way_and_ends_with_the_total():
    table = peers.where_table(collections.Counter({"a.py:f": 5, "b.py:g": -40, "c.py:h": 12}), 2).splitlines()
    assert [line.split()[-1] for line in table[1:]] == ["b.py:g", "c.py:h", "them"]
    assert table[-1].split()[0] == "-23"
    assert table[1].split()[0] == "-40"
