import json

import pytest

from nbtrain import TrainConfig
from nbtrain.tools.diagnose import diagnose, profile, verdict_for
from nbtrain.tools.tool_options import ToolOptionError

from checklist_recipes import compute_bound_recipe, data_bound_recipe, same_state, state, tiny_ops_recipe


@pytest.mark.slow
def test_verdict_is_data_bound_for_a_heavy_per_sample_transform():
    d = diagnose(data_bound_recipe(), config=TrainConfig(batch_size=32), steps=5)
    assert d.kind == "data-bound", d.table()
    assert d.verdict.startswith("data-bound: ") and "waits for the DataLoader; try preload_data=True" in d.verdict
    assert d.fractions["data"] > 0.5
    assert "verdict: data-bound" in d.table()
    # the ceilings, measured apart, agree, say by how much, and order the remedies
    assert d.ceilings.kind == "data-bound" and d.verdict.startswith("data-bound: the loader can deliver ")
    assert "the four ceilings, each measured alone, binding first:\n  data " in d.table()
    assert d.suggestions == [r.text for r in d.ceilings.bottleneck().remedies]
    assert "model FLOPs utilisation" in d.table() and "(training)" in d.table()
    assert f"({d.steady.text()})" in d.table() and d.samples_per_s == d.steady.rate


@pytest.mark.slow
def test_verdict_flips_to_compute_bound_for_a_big_model_on_ready_tensors():
    d = diagnose(compute_bound_recipe(n=1024, width=1024), config=TrainConfig(batch_size=512), steps=5)
    assert d.kind == "compute-bound", d.table()
    assert d.fractions["forward"] + d.fractions["backward"] > 0.5
    assert "of the step is forward and backward" in d.verdict
    assert d.ceilings.kind == "compute-bound" and d.verdict.startswith("compute-bound: the device's peak FLOP/s")
    assert 0 < d.ceilings.utilisation(d.samples_per_s) < 1.2


@pytest.mark.slow
def test_forward_and_backward_of_tiny_operations_are_the_hosts_time():
    d = diagnose(tiny_ops_recipe(), config=TrainConfig(batch_size=8), steps=20)
    # the phases say forward and backward; the ceilings say whose time that is, and what to try first
    assert d.kind == "host-bound" and "of the step is forward and backward; try batch_size=16" in d.verdict, d.table()
    assert d.suggestions[0].startswith("batch_size=16") and "  try: compile=" in d.table()


def test_ceilings_that_disagree_with_the_breakdown_are_reported_beside_it():
    from types import SimpleNamespace
    ceilings = SimpleNamespace(kind="compute-bound", evidence=lambda: "the model can take 100 samples/s, the loader "
                               "could deliver 500", margin=lambda: "x",
                               bottleneck=lambda: SimpleNamespace(binding="compute", kind="compute-bound", remedies=()))
    kind, verdict, _ = verdict_for({"data": 6.0, "forward": 2.0, "backward": 2.0}, 10.0,
                                   TrainConfig(batch_size=32, num_workers=1), "cpu", cores=2, ceilings=ceilings)
    assert kind == "data-bound" and verdict.startswith("data-bound in training: 60% of the step waits")
    assert "measured alone the ceilings say compute-bound (the model can take 100" in verdict


def test_data_bound_with_workers_already_running_suggests_the_cache():
    config = TrainConfig(batch_size=32, num_workers=1)
    kind, verdict, tips = verdict_for({"data": 8.0, "forward": 1.0, "backward": 1.0}, 10.0, config, "cpu", cores=2)
    assert kind == "data-bound" and "80% of the step waits for the DataLoader" in verdict
    assert any("nbtrain.cache(dataset, path)" in tip for tip in tips)


def test_profile_restores_the_model_and_writes_a_perfetto_trace(tmp_path):
    recipe = compute_bound_recipe(n=256, width=64)
    before = state(recipe.model)
    d = profile(recipe, config=TrainConfig(batch_size=32), steps=3, trace=tmp_path / "trace.json", ceilings=False)
    assert same_state(before, state(recipe.model))
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert "torch.profiler trace" in d.table() and d.ceilings is None and "ceilings" not in d.table()
    d.plot(path=tmp_path / "phases.png")
    assert (tmp_path / "phases.png").stat().st_size > 1000


def test_bad_step_count_names_the_option():
    with pytest.raises(ToolOptionError, match=r"steps=0: allowed: a whole number >= 1"):
        diagnose(compute_bound_recipe(n=64, width=8), steps=0)


@pytest.mark.cuda
def test_phases_add_up_to_the_step_on_cuda_when_synchronised():
    d = diagnose(compute_bound_recipe(), config=TrainConfig(batch_size=128, accelerator="cuda"), steps=10)
    assert d.synced
    assert sum(v for k, v in d.phase_ms.items() if k != "other") == pytest.approx(d.step_ms, rel=0.2)
    assert d.phase_ms["forward"] + d.phase_ms["backward"] > d.phase_ms["data"]


@pytest.mark.slow
def test_ddp_gradient_sync_is_timed_on_every_rank(tmp_path):
    import cloudpickle

    import checklist_recipes
    from nbtrain.distributed.launch import launch

    # Ranks cannot import the tests' helper module: ship it by value, as a notebook's code is.
    cloudpickle.register_pickle_by_value(checklist_recipes)
    launch(checklist_recipes.ddp_diagnose_rank, nprocs=2, args=(str(tmp_path),))
    for rank in (0, 1):
        numbers = json.loads((tmp_path / f"rank{rank}.json").read_text())
        # timed on every rank (its size against the step is a timing, which a busy machine skews)
        assert 0 < numbers["grad_sync_ms"] < float("inf") and numbers["step_ms"] > 0
        assert "gradient sync" in numbers["table"] and "overlapping backward" in numbers["table"]
