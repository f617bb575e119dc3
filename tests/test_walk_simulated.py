"""The checklist walk on simulated machines (nbtrain/tools/simulated_machine.py, landscapes in
tests/landscapes.py): seeded, deterministic, seconds to run. Each landscape's exhaustive grid (batch x
workers x held data x precision) is scored by the true rates; so is the walk's choice."""
import ast
import dataclasses
import inspect
import math

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from landscapes import LANDSCAPES, grid, walk_against_grid
from nbtrain import TrainConfig
from nbtrain.walk import tool as walk_tool, walker
from nbtrain.walk.items import ITEMS
from nbtrain.walk.walker import run_walk
from simulated_machine import Landscape, SimulatedMachine, parts, start_up_s, true_rate

H200 = LANDSCAPES[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_walk_reaches_nine_tenths_of_the_grids_best_in_two_fifths_of_its_time(seed):
    results = {land.name: walk_against_grid(land, seed) for land in LANDSCAPES}
    # 0.4 of the grid's time (was a third): a change that alters what is learned also races what it learns, and the
    # walk's choice races it against the start at the end (rule 11, walk/quality.py)
    good = [name for name, r in results.items() if r["quality"] >= 0.90 and r["time"] <= 0.4]
    report = {name: (round(r["quality"], 2), round(r["time"], 2)) for name, r in results.items()}
    assert len(LANDSCAPES) >= 12 and len(good) >= len(LANDSCAPES) - 1, report
    for r in results.values():  # no round was started that would pass the budget
        assert r["walk"].elapsed_s <= r["walk"].budget_s, (r["walk"].device, r["walk"].elapsed_s)


def test_the_h200_walk_follows_the_bottleneck_from_the_host_to_the_loader_and_asks_for_held_data_again(tmp_path):
    # The first GPU walk raced held data once at batch 32, bound by the host, and never again at 2048,
    # where it pays ~3x: here it is tried under the host, rejected, and tried again once the loader binds.
    r = walk_against_grid(H200, seed=0)
    walk = r["walk"]
    bindings = [b.binding for _, b in walk.path if b is not None]  # (the last may find no time for a reading)
    assert bindings[:2] == ["host", "data"], walk.table()
    kept = [(i.bottleneck, i.name) for i in walk.items if i.kept]
    assert kept[:2] == [("host", "batch_size"), ("data", "preload_data")], walk.table()
    assert walk.best_config.preload_data and walk.best_config.batch_size == 2048
    assert r["quality"] >= 0.9 and r["time"] <= 1 / 3
    table = walk.table()
    assert "bound by" in table and "path: host-bound -> data-bound" in table
    rows = walk.rows()  # one row an item, in the order first walked; its other races said in it
    lines = [line.split()[:2] for line in table.splitlines()[3:3 + len(rows)]]
    assert lines == [[i.bottleneck or "-", i.name] for i in rows], table
    figure = walk.plot(tmp_path / "walk.png")  # and the waterfall's bars, each with its bottleneck
    ticks = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert ticks[1:3] == ["batch_size\n(host-bound)", "preload_data\n(data-bound)"] and ticks[-1] == "result\n(head to head)", ticks
    ax, renderer = figure.axes[0], FigureCanvasAgg(figure).get_renderer()  # (saved and closed: drawn again)
    figure.draw_without_rendering()
    top = ax.get_window_extent(renderer).y1
    labels = [text for text in ax.texts if text.get_text()]
    assert len(labels) == len(rows) + 2  # start, each item, result: each label ends inside the axes
    assert all(label.get_window_extent(renderer).y1 <= top for label in labels), [t.get_text() for t in labels]
    boxes = [label.get_window_extent(renderer) for label in labels]
    assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:])), [t.get_text() for t in labels]  # nor each other


def test_an_item_rejected_under_one_bottleneck_is_raced_again_when_the_bottleneck_moves():
    # The first GPU walk's order: held data first, at batch 32, bound by the host (no gain there), and never
    # again. A machine whose host-bound reading puts held data first: rejected under the host, raced again
    # and kept once batch 2048 makes the loader bind.
    class HeldDataFirst(SimulatedMachine):
        def bottleneck(self, config, seconds):
            b = super().bottleneck(config, seconds)
            first = sorted(b.remedies, key=lambda r: r.item != "preload_data")
            return dataclasses.replace(b, remedies=tuple(first), ratios={**b.ratios, "data": 1.0})

    # 12 us of host work per operation, 6 us per sample loaded: held data gains ~2% at batch 32, ~1.4x at 2048
    land = dataclasses.replace(H200, host_op_s=12e-6, loader_s=6e-6)
    machine = HeldDataFirst(land, seed=0)
    walk = run_walk(machine, budget_s=60, clock=machine.clock)
    held = [(i.bottleneck, i.kept) for i in walk.items if i.name == "preload_data"]
    assert held[0] == ("host", False) and any(kept and where != "host" for where, kept in held[1:]), walk.table()
    assert walk.best_config.preload_data and walk.best_config.batch_size == 2048, walk.table()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_item_rejected_before_a_keep_is_raced_again_at_the_config_kept(seed):
    # The CPU benchmark on this 2-core box: two workers gain nothing at batch 16 (each batch they hand over
    # costs the main process ~2 ms) and 1.7x at a large batch. Here the largest batch does not fit in memory,
    # so the workers' race at batch 16 (and at the largest batch, which fails) rejects them; the batch item then
    # keeps 128 under the same (data) bottleneck. A walk that forgot a rejection only when the bottleneck
    # moved never raced workers again: 0.46 of the grid's best.
    land = next(land for land in LANDSCAPES if land.name == "cpu-data-bound-fft-2-cores")
    land = dataclasses.replace(land, name="cpu-fft-2-cores-memory-limited", activation_bytes=1e7, memory=2e9)
    r = walk_against_grid(land, seed)
    workers = [i.kept for i in r["walk"].items if i.name == "workers"]
    assert workers[0] is False and any(workers[1:]), r["walk"].table()
    assert r["walk"].best_config.num_workers == 2 and r["quality"] >= 0.9, r["walk"].table()


def test_workers_raced_before_any_batch_race_the_largest_batch_as_well():
    # Workers pay once a batch keeps them busy: raced at batch 16 alone they lose, and a walk that then races
    # batches alone keeps 1.1x; one candidate more, the most workers at the largest batch, finds 2.7x at once.
    land = next(land for land in LANDSCAPES if land.name == "cpu-data-bound-fft-2-cores")
    r = walk_against_grid(land, seed=0)
    first = next(i for i in r["walk"].items if i.name != "threads")  # threads: raced first on every CPU
    assert first.name == "workers" and first.kept and first.chosen == "num_workers=2, batch_size=256", r["walk"].table()
    assert r["quality"] >= 0.9 and r["time"] <= 0.35, (r["quality"], r["time"])  # (0.25 before races of what is learned)


def test_the_walk_is_deterministic_for_a_seed():
    one, two = (run_walk(m, budget_s=60, clock=m.clock) for m in (SimulatedMachine(H200, seed=5),
                                                                   SimulatedMachine(H200, seed=5)))
    assert one.table() == two.table()


def test_an_undecided_race_says_why():
    noisy = dataclasses.replace(LANDSCAPES[5], name="noisy", noise=0.12, drift=0.06)
    notes = []
    for seed in range(4):
        walk = run_walk(m := SimulatedMachine(noisy, seed=seed), budget_s=60, clock=m.clock)
        notes += [i.verdict_text() for i in walk.items if "too noisy to tell:" in i.note]
    assert notes and all("blocks varied most" in n and "interquartile range" in n for n in notes), notes


def test_the_cost_model():
    start = TrainConfig(accelerator="cuda", batch_size=256)
    conv = Landscape("conv", start)
    # TF32 runs float32 convolutions (cuDNN's default) far faster than float32 matmuls at 'highest'
    matmuls = dataclasses.replace(conv, conv_share=0.0)
    assert parts(conv, start)["compute"] < 0.3 * parts(matmuls, start)["compute"]
    assert parts(matmuls, start.replace(matmul_precision="high"))["compute"] < 0.2 * parts(matmuls, start)["compute"]
    # a pageable copy blocks the host; a pinned one does not
    assert parts(conv, start.replace(pin_memory=False))["host"] > parts(conv, start)["host"]
    # the loader's per-sample cost is divided among workers, the cores allowing; start-up once per config
    workers = [parts(conv, start.replace(num_workers=n, persistent_workers=True))["loader"] for n in (1, 2, 4)]
    assert workers[0] == pytest.approx(2 * workers[1]) == pytest.approx(4 * workers[2])
    few = dataclasses.replace(conv, cores=3)
    assert parts(few, start.replace(num_workers=8))["loader"] == pytest.approx(parts(few, start.replace(num_workers=2))["loader"])
    assert start_up_s(conv, start.replace(num_workers=4)) > 1 and start_up_s(conv, start) == 0
    # a batch over the memory limit does not run; in bf16 twice the batch fits
    small = dataclasses.replace(conv, activation_bytes=1e9, memory=300e9)
    assert true_rate(small, start) > 0 and true_rate(small, start.replace(batch_size=512)) == 0
    assert true_rate(small, start.replace(batch_size=400, precision="bf16-mixed")) > 0
    machine = SimulatedMachine(small)
    assert machine.block(start.replace(batch_size=512), 0.5).note == "out of memory"
    # each grid has every batch x workers x held data x precision, held data without workers
    assert len(grid(H200)) == 7 * (5 + 1) * 3


def test_the_walk_never_names_an_item():
    # Items are objects registered once (walk/items.py); the walk reads their fields, never their names.
    for module in (walker, walk_tool):
        tree = ast.parse(inspect.getsource(module))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        named = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                 and isinstance(node.value, str) and id(node) not in docstrings and node.value in ITEMS}
        assert not named, (module.__name__, named)
    assert math.isfinite(true_rate(H200, H200.start))


def test_a_race_too_noisy_to_tell_gets_a_second_look_while_the_budget_lasts():
    # The first CPU benchmark after the walk followed the bottleneck ended at 28 s of 120 with every race
    # "too noisy to tell" (the box's load moved by 90%); a passing load decides one race, rarely two.
    noisy = dataclasses.replace(LANDSCAPES[5], name="noisy", noise=0.12, drift=0.06)
    # 90 s: a batch kept must also race what it learns (rule 11, walk/quality.py), which 60 s leaves no room for
    walk = run_walk(m := SimulatedMachine(noisy, seed=0), budget_s=90, clock=m.clock)
    rows = [(i.name, i.kept, i.note.startswith("too noisy to tell")) for i in walk.items]
    first = rows.index(("batch_size", False, True))
    assert ("batch_size", True, False) in rows[first + 1:], walk.table()
    assert not any(kept for _, kept, _ in rows[:first]), walk.table()  # the same config, looked at again
