"""Faster means the same model sooner (issue 48, rule 11): the walk keeps only what its own closing race backs, and
a change that alters what is learned is judged by held-out loss at equal wall time (simulated machine)."""
import dataclasses
import math

import pytest
import torch

from landscapes import LANDSCAPES
from nbtrain.walk.walker import run_walk
from simulated_machine import SimulatedMachine, true_rate

H200 = LANDSCAPES[0]


class GainGoneAtTheEnd(SimulatedMachine):
    """The items' races read their true gains; the closing race (the start raced after the walk moved) sees every
    config at the start's rate, as a load that took the gain away would: it reads no measurable difference."""

    moved = False

    def block(self, config, seconds, current=None):
        self.moved |= current is not None and current != self.start
        if self.moved and current == self.start and config != self.start:
            config = self.start  # timed as the start: the same true rate on both sides
        return super().block(config, seconds, current)


def test_a_walk_whose_closing_race_reads_no_difference_keeps_nothing():
    machine = GainGoneAtTheEnd(H200, seed=0)
    walk = run_walk(machine, budget_s=60, clock=machine.clock, keep_best=True)
    assert any(i.kept for i in walk.items), walk.table()  # the items kept changes on their own races
    assert walk.chosen_config != walk.start_config and walk.best_config == walk.start_config, walk.table()
    assert not walk.head_to_head.verdict.faster and not walk.moved
    assert walk.headline().startswith("nothing kept: the closing race of the walk's choice against the start read "
                                      + walk.head_to_head.verdict.text()), walk.headline()
    assert "best config: the starting one" in walk.table() and "nothing kept" in walk.table().splitlines()[-4]
    # an honest walk on the same machine keeps what its closing race backs
    plain = run_walk(m := SimulatedMachine(H200, seed=0), budget_s=60, clock=m.clock)
    assert plain.moved and plain.head_to_head.verdict.faster and not plain.withdrawn, plain.table()
    assert plain.best_config == plain.chosen_config


def goodput(land, config) -> float:
    """Samples/s times what each sample is worth at the config's global batch (McCandlish et al.: 1 / (1 + B/B_noise))."""
    return true_rate(land, config) / (1 + config.global_batch_size / land.b_noise)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_candidate_faster_per_sample_but_worse_per_second_in_loss_is_not_kept(seed):
    # A gradient noise scale of 64: batch 2048 trains ~9x the samples/s of batch 32, each worth 1/22 as much.
    land = dataclasses.replace(H200, name="h200-noise-scale-64", b_noise=64, loss_samples=2000)
    biggest = dataclasses.replace(H200.start, batch_size=2048)
    assert true_rate(land, biggest) > 5 * true_rate(land, H200.start) and goodput(land, biggest) < goodput(land, H200.start)
    walk = run_walk(m := SimulatedMachine(land, seed=seed), budget_s=60, clock=m.clock)
    first = next(i for i in walk.items if i.name == "batch_size")
    assert first.note.startswith("not kept: batch_size="), walk.table()
    label = first.note[len("not kept: "):].split(" learns worse in the same time (held-out (simulated) ")[0]
    raced = next(t for t in first.tried if t.label == label)  # the race's leader, rejected for what it learns
    assert raced.verdict.ratio > 3 and goodput(land, raced.config) < goodput(land, H200.start), walk.table()
    assert "0.5 s of training each from the same weights, 3 times" in first.note  # the horizon the verdict covers
    # the batch row shows the critical batch size read at the current batch (the landscape's noise scale: 64)
    shown = next(i for i in walk.rows() if i.name == "batch_size")  # the row the table shows for the item
    assert first.about.startswith("critical batch size ~6") and f"[{shown.about}]" in walk.table(), walk.table()
    assert walk.best_config.batch_size < 2048 and goodput(land, walk.best_config) > goodput(land, H200.start), walk.table()
    if walk.best_config.global_batch_size != H200.start.global_batch_size:  # a batch kept learns as well at the end
        assert walk.learned is not None and walk.learned.measured and not walk.learned.worse, walk.table()
        assert walk.learned.text() in walk.table()
    # where each sample is worth as much at any batch (no noise-scale limit), the largest batch is kept
    plain = run_walk(m := SimulatedMachine(H200, seed=seed), budget_s=60, clock=m.clock)
    assert plain.best_config.batch_size == 2048, plain.table()


def test_a_batch_change_says_what_it_does_to_a_schedule_counted_in_steps_and_rescales_nothing():
    # The user's warm-up + decay stepped every step (nanoGPT's get_lr as a LambdaLR): at a batch 64x larger each of its
    # steps is 64x the samples. Said in the learning-rate line; the schedule itself is kept in steps, as written.
    machine = SimulatedMachine(H200, seed=0, stepping=("step", "LambdaLR every step (as given)"))
    walk = run_walk(machine, budget_s=60, clock=machine.clock)
    factor = walk.best_config.global_batch_size / walk.start_config.global_batch_size
    assert factor > 1, walk.table()
    assert (f"your schedule (LambdaLR every step (as given)) counts optimizer steps: at global batch "
            f"{walk.best_config.global_batch_size} instead of 32 each of its steps is {factor:.3g}x the samples") in walk.lr_note
    assert walk.lr_note.endswith("kept in steps, as written: nbtrain does not rescale a schedule unasked "
                                 "(schedule_counts='samples' lays it over samples)")
    assert "learning rate: " in walk.table()
    # a schedule stepped every epoch, and no warm-up: nothing counted in steps, nothing said
    quiet = run_walk(m := SimulatedMachine(H200, seed=0, stepping=("epoch", "StepLR every epoch")), budget_s=60,
                     clock=m.clock)
    assert "counts optimizer steps" not in quiet.lr_note and "kept in steps" not in quiet.lr_note
    from nbtrain.walk.steps_note import steps_note
    start = H200.start.replace(warmup_steps=5)
    assert steps_note(start, start.replace(batch_size=512), None) == (
        "warmup_steps=5 becomes 2,560 samples' worth (was 160); kept in steps, as written: nbtrain does not rescale "
        "a schedule unasked (schedule_counts='samples' lays it over samples)")
    asked = start.replace(base_batch_size=32, schedule_counts="samples")  # the user's choice, said as such
    assert steps_note(asked, asked.replace(batch_size=512), "step") == (
        "your schedule and warm-up are laid over samples, as asked (schedule_counts='samples': 16 of its steps per "
        "step)")


def test_a_peak_ratio_is_never_presented_as_the_expected_gain():
    # ceilings' first suggestion on nanoGPT read "a bf16 matmul ... 4.32x faster"; ab measured the step 1.09x slower.
    land = next(land for land in LANDSCAPES if land.name == "gpu-compute-bound-matmuls")
    reading = SimulatedMachine(land).ceilings(land.start, 0.5)
    lines = reading.remedy_lines()
    precision = next(line for line in lines if "precision='bf16-mixed'" in line)
    assert precision.startswith("  idea, not raced: precision='bf16-mixed': a bf16 matmul alone against the float32 "
                                "one here: "), lines
    assert "(the matmul's own ratio, not this step's expected gain: nbtrain.ab measures the step)" in precision
    assert all(line.startswith("  idea, not raced: ") for line in lines), lines  # nothing here was raced


class Counted(torch.utils.data.Dataset):
    """A regression data set that counts how often each sample is read."""

    def __init__(self, n=640):
        g = torch.Generator().manual_seed(0)
        self.x, self.reads = torch.randn(n, 4, generator=g), [0] * n
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(n, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.reads[i] += 1
        return self.x[i], self.y[i:i + 1]


def test_without_val_data_a_race_of_what_is_learned_holds_a_slice_out_of_training_and_says_so():
    from nbtrain.tools import trial
    from nbtrain.walk.bench import EngineBench
    from checklist_recipes import same_state, state
    torch.manual_seed(0)
    model, data = torch.nn.Linear(4, 1), Counted()
    before = state(model)
    with trial.borrow(model, data, loss_fn=torch.nn.MSELoss(), batch_size=16, accelerator="cpu") as lent:
        bench = EngineBench(lent)
        losses = [bench.quality(bench.start.replace(batch_size=b), 0.3) for b in (16, 64)]
    assert same_state(before, state(model))  # every race gave the weights back
    assert all(l.held_out == "held-out (128 training samples set aside, no val_data given)" for l in losses), losses
    assert all(math.isfinite(l.loss) and not l.note for l in losses), losses
    held = set(torch.randperm(640, generator=torch.Generator().manual_seed(0))[:128].tolist())  # the seeded slice
    # read once to score the starting weights and once by each race's scoring, never trained on
    assert all(data.reads[i] == 3 for i in held), data.reads
    assert all(l.start == losses[0].start and l.start > l.loss for l in losses), losses  # both left the start
    assert sum(n for i, n in enumerate(data.reads) if i not in held) > 2 * 512, data.reads  # the rest trained on
