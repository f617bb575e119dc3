"""The four ceilings of a training step on the live model (data, host, compute, memory), the verdict
as data (which binds, by how much, the remedies in order), and the model left exactly as it was."""
import dataclasses
import math

import pytest
import torch

import nbtrain
from nbtrain import TrainConfig
from nbtrain.api import engine_for
from nbtrain.engine.data import hold, refusal
from nbtrain.engine.dist import World
from nbtrain.measure import bottleneck
from nbtrain.measure.bottleneck import CEILINGS
from nbtrain.measure.device_rates import busy_from_events, host_split, peak_flops, union_length

from checklist_recipes import compute_bound_recipe, data_bound_recipe, same_state, state, tiny_ops_recipe


def groups(b):
    """The ceilings the remedies lift, in the order the remedies come, each once."""
    return list(dict.fromkeys(r.ceiling for r in b.remedies))


def every_ceiling_has_an_interval(c):
    for name in CEILINGS:
        r = c.ceiling(name)
        assert 0 < r.low <= r.value <= r.high, (name, r, c.table())
    assert c.table().count("95% interval") >= 4


def right_or_too_noisy(c, ceiling: str) -> bool:
    """The textbook case reads its ceiling, or (on a machine others load) says too noisy: never another one."""
    b = c.bottleneck()
    assert b.state == "noisy" or (b.binds and b.binding == ceiling), c.table()
    if b.state == "noisy":
        assert c.verdict.startswith("too noisy to tell: ") and "-bound" not in c.verdict, c.verdict
    return b.binds


@pytest.mark.slow
def test_many_tiny_operations_are_bound_by_the_host_and_a_larger_batch_comes_first():
    c = nbtrain.ceilings(tiny_ops_recipe(), config=TrainConfig(batch_size=8))
    b = bottleneck(c)
    if not right_or_too_noisy(c, "host"):
        return
    assert b.binding == "host" and c.kind == "host-bound" and b.order[0] == "host", c.table()
    # the fixed per-step cost is most of the step (how much more than the per-sample part, a busy machine's
    # noise decides: at batch 8 that part is next to nothing); compute and memory are far away
    assert c.split.host_s.value > c.split.device_s.value, c.table()
    assert b.ratios["compute"] > 10 and b.ratios["memory"] > 10 and b.ratios["host"] == 1
    assert [r.item for r in b.remedies[:3]] == ["batch_size", "compile", "optimizer_impl"], b.remedies
    assert groups(b)[0] == "host"
    every_ceiling_has_an_interval(c)
    assert c.verdict.startswith("host-bound: the host's fixed cost per step allows ")
    assert "step times at batch 8 and 2" in c.table() and "idea, not raced: batch_size=16" in c.table()


@pytest.mark.slow
def test_a_large_matmul_is_compute_bound_and_precision_or_fusion_comes_first():
    c = nbtrain.ceilings(compute_bound_recipe(n=1024, width=1024), config=TrainConfig(batch_size=512))
    b = c.bottleneck()
    if not right_or_too_noisy(c, "compute"):
        return
    assert b.binding == "compute" and b.order[0] == "compute", c.table()
    assert c.split.device_s.value > 3 * c.split.host_s.value, c.table()  # the per-sample part dominates
    assert b.measurable and b.ratios["memory"] > 1, c.table()  # more FLOPs per byte than the machine's balance
    assert groups(b)[0] == "compute" and b.remedies[0].item in ("precision", "compile"), b.remedies
    # the precision remedy says what it is compared against, with the bf16 matmul measured here
    precision = next(r for r in b.remedies if r.item == "precision")
    assert "compared against float32 on cpu (no TF32 there)" in precision.text and "a bf16 matmul" in precision.text
    every_ceiling_has_an_interval(c)
    assert 0 < c.utilisation() < 1.2, c.table()  # the measured peak is a 90th percentile, not a bound
    assert c.verdict.startswith("compute-bound: the device's peak FLOP/s allows ")


@pytest.mark.slow
def test_a_slow_loader_is_data_bound_and_its_remedies_come_first():
    c = nbtrain.ceilings(data_bound_recipe(), config=TrainConfig(batch_size=32))
    b = c.bottleneck()
    if not right_or_too_noisy(c, "data"):
        return
    assert b.binding == "data" and c.kind == "data-bound", c.table()
    assert c.loader.rate < c.model.rate and c.ratio.low > 1 and b.margin == c.ratio
    assert [r.item for r in b.remedies[:2]] == ["preload_data", "num_workers"] and groups(b)[0] == "data"
    every_ceiling_has_an_interval(c)
    assert c.verdict.startswith(f"data-bound: the loader can deliver {c.loader.rate:,.0f} samples/s, the model "
                                f"alone trains at {c.model.rate:,.0f} (the model alone is ")
    assert "verdict: data-bound" in c.table()


@pytest.mark.slow
def test_utilisation_counts_the_flops_of_a_matmul_heavy_mlp():
    width, batch = 512, 128
    c = nbtrain.ceilings(compute_bound_recipe(n=512, width=width), config=TrainConfig(batch_size=batch))
    # forward: 2 multiply-adds per weight per sample; backward: twice that (the first layer's input
    # gradient is not needed, so slightly less)
    weights = 256 * width + width * width + width * 4
    assert 0.6 * 6 * weights * batch < c.step_flops <= 6 * weights * batch
    # bytes: at least each weight read in forward, and the weights' gradients written
    assert c.counts.bytes >= 2 * 4 * weights and c.counts.optimizer_ops > 0 and c.counts.model_ops > 0
    assert c.peak.dtype == "float32" and c.peak.value > 0 and c.bandwidth.value > 0
    assert "model FLOPs utilisation" in c.table() and "FLOP/s, float32" in c.table() and "B/s, a " in c.table()


def test_the_host_split_finds_the_fixed_and_the_per_sample_cost():
    # 3 ms fixed + 0.1 ms per sample, with a little alternating noise
    rng = torch.Generator().manual_seed(0)
    noise = (torch.rand(40, generator=rng) * 1e-4).tolist()
    full = [0.003 + 0.0001 * 64 + e for e in noise]
    small = [0.003 + 0.0001 * 2 + e for e in reversed(noise)]
    s = host_split(full, small, 64, 2)
    assert s.host_s.value == pytest.approx(0.003, abs=1e-4) and s.device_s.value == pytest.approx(0.0064, abs=2e-4)
    assert s.host_s.low <= s.host_s.value <= s.host_s.high and s.host_share.value == pytest.approx(0.003 / 0.0064,
                                                                                                  rel=0.05)


def test_the_busy_time_is_the_union_of_overlapping_intervals():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4 and union_length([]) == 0


def test_the_gpu_busy_fraction_is_read_from_a_traces_kernels_within_each_step():
    def event(cat, name, ts, dur):
        return {"cat": cat, "name": name, "ts": ts, "dur": dur}
    events = [event("user_annotation", "nbtrain_step", 0, 100), event("user_annotation", "nbtrain_step", 200, 100),
              event("gpu_user_annotation", "nbtrain_step", 5, 290),  # the GPU's copy: not a step's wall
              event("kernel", "gemm", 10, 20), event("kernel", "relu", 20, 30), event("kernel", "add", 250, 10),
              event("cpu_op", "aten::mm", 0, 90)]
    busy = busy_from_events(events)
    # step 1: kernels cover 10-50 of 100 us; step 2: 10 of 100 us
    assert busy.fraction.value == pytest.approx(0.25) and busy.kernels_per_step == 1.5
    assert busy.median_kernel_us == 20


def test_the_peak_is_measured_in_the_steps_dtype_with_an_interval():
    peak = peak_flops(torch.device("cpu"), torch.bfloat16, seconds=0.05)
    assert peak.value > 0 and peak.size >= 256 and peak.dtype == "bfloat16"
    assert peak.low <= peak.value <= peak.high and math.isfinite(peak.high)


def test_measuring_the_ceilings_leaves_model_optimizer_rng_and_config_exactly_as_they_were():
    recipe = compute_bound_recipe(n=256, width=64)
    recipe.optimizer = lambda p: torch.optim.Adam(p, lr=1e-3)
    config = TrainConfig(batch_size=32, max_steps=3)
    engine = engine_for(recipe, config)
    engine.run()  # moved weights and Adam moments: a restore has something to get wrong
    before = state(recipe.model, engine.optimizer)
    lrs = [g["lr"] for g in engine.optimizer.param_groups]
    counters, rng = (engine.step, engine.samples, engine.epoch_offset), torch.get_rng_state()
    grads = [p.grad for p in recipe.model.parameters()]
    nbtrain.ceilings(recipe, config=config, steps=10, seconds=0.5)
    assert same_state(before, state(recipe.model, engine.optimizer))
    assert [g["lr"] for g in engine.optimizer.param_groups] == lrs  # measured at rate 0, put back
    assert (engine.step, engine.samples, engine.epoch_offset) == counters and engine.config == config
    assert torch.equal(rng, torch.get_rng_state())
    assert all((a is None) == (p.grad is None) for a, p in zip(grads, recipe.model.parameters()))


def test_bad_ceiling_options_name_the_option():
    with pytest.raises(ValueError, match=r"steps=3: allowed: a whole number >= 10"):
        nbtrain.ceilings(compute_bound_recipe(n=64, width=8), steps=3)


@pytest.mark.cuda
def test_on_cuda_the_gpu_busy_fraction_tells_a_small_batch_from_a_large_one():
    small = nbtrain.ceilings(tiny_ops_recipe(), config=TrainConfig(batch_size=8, accelerator="cuda"))
    assert small.busy is not None and small.busy.fraction.value < 0.5 and small.kind == "host-bound", small.table()
    assert "GPU busy" in small.table() and "kernels per step" in small.table()
    big = nbtrain.ceilings(compute_bound_recipe(n=8192, width=4096), config=TrainConfig(batch_size=4096,
                                                                                       accelerator="cuda"))
    assert big.busy.fraction.value > 0.5 and big.kind in ("compute-bound", "memory-bound"), big.table()


class _Augmented(torch.utils.data.Dataset):
    """A random augmentation: each read of a sample differs (the held-data rule refuses to hold it)."""

    def __init__(self, noise: bool):
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.noise = torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g), noise

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + (0.1 * torch.randn(16) if self.noise else 0), self.y[i]


@pytest.mark.slow
def test_the_data_remedies_offer_preload_data_only_where_the_held_data_rule_would_hold_the_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    c = nbtrain.ceilings(model, _Augmented(noise=True), loss_fn=torch.nn.CrossEntropyLoss(),
                         config=TrainConfig(batch_size=32), steps=10, seconds=0.3)
    offered = [r.item for r in c.bottleneck().remedies]
    assert "preload_data" not in offered and "num_workers" in offered, (offered, c.hold_refused)
    # the rule's own reason, asked of the rule (engine/data.refusal), not restated here
    assert c.hold_refused.startswith("reading 256 samples twice gave different values"), c.hold_refused
    held = dataclasses.replace(c, hold_refused=None)  # the same reading of data the rule would hold
    assert "preload_data" in [r.item for r in held.bottleneck().remedies]


@pytest.mark.parametrize("noise, workers, refused", [(True, 0, "reading 256 samples twice"), (False, 0, None),
                                                     (False, 2, "num_workers=2 asks for the DataLoader")])
def test_the_held_data_rules_refusal_is_the_one_hold_gives(noise, workers, refused):
    dataset, config = _Augmented(noise), TrainConfig(preload_data=True, num_workers=workers)
    why = refusal(dataset, config)
    held, note = hold(dataset, config, World(), torch.device("cpu"))
    assert (why is None) is (held is not None) and (why or "").startswith(refused or ""), (why, note)
    if why:
        assert note == f"preload_data: not used, {why}"
