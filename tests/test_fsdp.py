"""strategy=fsdp: FSDP2 over 2 real CPU processes (gloo) trains like one process and hands back full weights."""
import sys

import cloudpickle
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import nbtrain
from nbtrain import ConfigError, Engine, TrainConfig
from nbtrain.demo import digits_recipe
from nbtrain.distributed.launch import launch
from nbtrain.engine.split import split

from helpers import fit_on_two_local_nodes, same_weights, weights

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.slow
def test_fsdp_on_two_processes_matches_one_process_with_the_same_global_batch():
    single, sharded = digits_recipe(seed=0), digits_recipe(seed=0)
    before = weights(sharded.model)
    reference = Engine(single, TrainConfig(batch_size=32, max_steps=8, accelerator="cpu")).run()
    result = nbtrain.fit(recipe=sharded, config=TrainConfig(devices=2, strategy="fsdp", batch_size=16, max_steps=8,
                                                            accelerator="cpu", log_every_n_steps=4))
    assert result.status == "completed" and result.history["step"] == list(range(1, 9))
    # The kernel's model holds the full trained weights, gathered from both shards.
    assert not same_weights(weights(sharded.model), before, atol=1e-3)
    assert same_weights(weights(sharded.model), weights(single.model), atol=1e-5)
    # Every rank validated the sharded model (its forward gathers from all ranks) and agrees with one process.
    assert result.summary.val_loss == pytest.approx(reference.summary.val_loss, abs=1e-5)
    s = result.summary
    assert s.strategy == "fsdp" and s.world_size == 2 and s.global_batch == 32
    # Only the weights carry over to a later call (the optimizer state is sharded): said, not left silent.
    assert any(note.startswith("strategy=fsdp: only the weights carry over") for note in s.notes)
    peaks = s.peak_mem_mb_per_rank
    assert len(peaks) == 2 and all(mb > 0 for mb in peaks) and peaks[0] == s.peak_mem_mb
    table = result.table()
    assert "cpu x2, 32-true, fsdp" in table and "per rank 0: " in table and ", 1: " in table


def _train_fsdp_counting_reduce_scatters(accumulate):
    """On each rank: FSDP training with 1 and with `accumulate` micro-batches, counting gradient reductions."""
    from torch.distributed.tensor.debug import CommDebugMode
    from nbtrain import Engine, TrainConfig
    from nbtrain.demo import digits_recipe
    from nbtrain.engine.fsdp import full_state_dict

    counts, state, wrapper = {}, None, None
    for k in (1, accumulate):
        engine = Engine(digits_recipe(seed=0), TrainConfig(devices=2, strategy="fsdp", batch_size=32 // (2 * k),
                                                           accumulate_grad_batches=k, max_steps=3, accelerator="cpu"))
        with CommDebugMode() as comms:
            engine.run()
        counts[k] = sum(n for op, n in comms.get_comm_counts().items() if "reduce_scatter" in str(op))
        wrapper = type(engine.train_model).__name__
        state = full_state_dict(engine.model)
    return wrapper, counts, [state[k] for k in sorted(state)]


@pytest.mark.slow
def test_accumulation_under_fsdp_reduces_gradients_only_on_the_last_micro_batch_and_keeps_the_math():
    wrapper, counts, state = launch(_train_fsdp_counting_reduce_scatters, nprocs=2, args=(4,))
    assert wrapper == "FSDPDigitsMLP"  # sharded in place, not wrapped in DDP
    # 3 optimizer steps of 4 micro-batches reduce as often as 3 steps of 1: 9 of 12 skipped.
    assert counts[1] > 0 and counts[4] == counts[1], counts
    # 2 ranks x 4 micro-batches of 4 = one process's batch of 32.
    single = digits_recipe(seed=0)
    Engine(single, TrainConfig(batch_size=32, max_steps=3, accelerator="cpu")).run()
    expected = single.model.state_dict()
    assert same_weights(state, [expected[k] for k in sorted(expected)], atol=1e-5)


def test_fsdp_configurations_that_cannot_work_are_refused_with_the_reason():
    with pytest.raises(ConfigError, match=r"strategy='fsdp': fsdp shards the model over >= 2 processes; "
                                          r"devices x num_nodes is 1"):
        TrainConfig(strategy="fsdp", accelerator="cpu")
    with pytest.raises(ConfigError, match=r"checkpoint_every='5': None with strategy=fsdp"):
        TrainConfig(strategy="fsdp", devices=2, accelerator="cpu", checkpoint_every=5)
    recipe = digits_recipe()
    split(recipe.model, {"net": "cpu"})
    with pytest.raises(ConfigError, match=r"strategy='fsdp': cannot shard a model split across devices"):
        nbtrain.fit(recipe=recipe, config=TrainConfig(strategy="fsdp", devices=2, accelerator="cpu", max_steps=1))


def test_the_magic_trains_with_fsdp_on_two_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("NBTRAIN_STORE", str(tmp_path / "runs.sqlite"))
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbtrain")
    ip.run_cell("from nbtrain.demo import DigitsDataset, DigitsMLP\nimport torch\ntorch.manual_seed(0)\n"
                "model = DigitsMLP(hidden=32)\nbefore = [p.detach().clone() for p in model.parameters()]")
    cell = ip.run_cell("%%nbtrain --devices 2 --strategy fsdp --accelerator cpu --max-steps 3 --batch-size 16 "
                       "--no-plot --no-progress --name sharded\ntrain_data = DigitsDataset()\n"
                       "loss_fn = torch.nn.CrossEntropyLoss()\n")
    assert cell.error_in_exec is None, cell.error_in_exec
    result = ip.user_ns["sharded"]
    assert result.status == "completed" and result.summary.strategy == "fsdp"
    assert len(result.summary.peak_mem_mb_per_rank) == 2
    assert not same_weights(weights(ip.user_ns["model"]), ip.user_ns["before"], atol=1e-4)


@pytest.mark.cuda
def test_fsdp_on_two_gpus_matches_one_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    single, sharded = digits_recipe(seed=0), digits_recipe(seed=0)
    Engine(single, TrainConfig(batch_size=32, max_steps=4, accelerator="cuda")).run()
    result = nbtrain.fit(recipe=sharded, config=TrainConfig(devices=2, strategy="fsdp", batch_size=16, max_steps=4,
                                                            accelerator="cuda"))
    assert result.status == "completed" and result.summary.mem_kind == "CUDA allocated"
    assert same_weights(weights(sharded.model), [w.cpu() for w in weights(single.model)], atol=1e-4)


@pytest.mark.slow
def test_fsdp_across_two_nodes_gives_both_kernels_the_full_weights():
    recipes = [digits_recipe(seed=0), digits_recipe(seed=0)]
    results = fit_on_two_local_nodes(recipes, strategy="fsdp", batch_size=16, shuffle=False, max_steps=4,
                                     accelerator="cpu")
    assert [r.summary.strategy for r in results] == ["fsdp", "fsdp"]
    single = digits_recipe(seed=0)
    Engine(single, TrainConfig(batch_size=32, shuffle=False, max_steps=4, accelerator="cpu")).run()
    for recipe in recipes:  # the first rank of each node received the gathered weights
        assert same_weights(weights(recipe.model), weights(single.model), atol=1e-5)
