"""The control panel's logic, without a browser: real widgets, a real engine, real training.

Each test builds the panel with display=False, sets widget values and clicks buttons as
a user would, and checks the live engine and the panel's own status text.
"""
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import ipywidgets as widgets
import nbtrain
from nbtrain import hardware
from nbtrain.notebook.panel_layout import descendants
from nbtrain.demo import digits_recipe
from nbtrain.recipe import Recipe

os.environ.setdefault("OMP_NUM_THREADS", "1")
NO_GPU = hardware.Inventory(cuda_devices=0, cuda_bf16=False, mps=False, cpu_cores=2)


@pytest.fixture
def make_panel():
    made = []

    def make(recipe=None, config=None):
        # On the CPU unless a test says otherwise, so the numbers checked are the same on a GPU machine.
        config = config or nbtrain.TrainConfig(accelerator="cpu")
        panel = nbtrain.panel(recipe or digits_recipe(), config, display=False)
        made.append(panel)
        return panel

    yield make
    for panel in made:
        panel.close()


def wait_until(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


def row_cells(panel, number: int) -> list[str]:
    """The runs table's main cells of run #number, as shown."""
    import html
    row = re.search(rf"<tr class='nbtrain-run-row' data-run='{number}' data-status='\w+'>(.*?)</tr>",
                    panel.table.html.value).group(1)
    return [html.unescape(cell) for cell in re.findall(r"<td>(.*?)</td>", row)]


def text_of(html_value: str) -> str:
    import html
    return html.unescape(re.sub(r"<style>.*?</style>|<[^>]+>", "", html_value, flags=re.S))


def start_long_run(panel):
    panel.controls.max_epochs.value = "1000"
    panel.run_button.click()
    wait_until(lambda: panel.engine.running and panel.engine.step >= 5)


@pytest.mark.slow
def test_importing_nbtrain_does_not_import_ipywidgets_until_panel_is_called():
    code = ("import sys, nbtrain; assert 'ipywidgets' not in sys.modules, 'imported early'; "
            "import nbtrain.demo; assert 'ipywidgets' not in sys.modules, 'demo imported it'; "
            "p = nbtrain.panel(nbtrain.demo.digits_recipe(), display=False); "
            "assert 'ipywidgets' in sys.modules; p.close(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_run_trains_the_live_model_with_the_settings_chosen_in_the_panel(make_panel):
    recipe = digits_recipe()
    panel = make_panel(recipe)
    before = [p.detach().clone() for p in recipe.model.parameters()]
    panel.controls.batch_size.value = "64"
    panel.controls.precision.select("bf16-mixed")
    panel.controls.max_steps.value = "12"
    panel.run_button.click()
    assert panel.run_button.disabled and not panel.stop_button.disabled  # while it runs
    assert panel.wait(60)
    engine = panel.engine
    assert engine.model is recipe.model
    assert (engine.config.batch_size, engine.config.precision, engine.step) == (64, "bf16-mixed", 12)
    assert any(not torch.equal(a, b) for a, b in zip(before, recipe.model.parameters()))
    steady = panel.runs[0].result.steady()
    assert panel.status_text.startswith(f"run #1 completed after 12 steps — {steady.text()}, final loss "), \
        panel.status_text
    cells = row_cells(panel, 1)
    assert cells[:4] == ["#1", "(first run)", "completed", "12"]
    assert cells[4].startswith(f"{steady.rate:,.0f}")  # steady samples/s, then its interval where it has one
    assert cells[6].endswith(" MB")
    assert not panel.run_button.disabled and panel.stop_button.disabled
    assert panel.errors == []


def test_readout_states_the_global_batch_and_the_scaled_learning_rate(make_panel):
    panel = make_panel()
    assert "global batch 32</b> = batch 32 × accumulate 1 × 1 device" in panel.readout.value
    assert "learning rate 0.003" in panel.readout.value  # digits recipe: AdamW(lr=3e-3)
    panel.controls.batch_size.value = "64"
    panel.controls.accumulate.value = 2
    panel.controls.scale_lr.value = "linear"  # tuned for the starting global batch, 32
    text = panel.readout.value
    assert "global batch 128</b> = batch 64 × accumulate 2 × 1 device" in text
    assert "learning rate 0.012 (linear rule: base 0.003 x 4 for global batch 128 vs 32)" in text
    panel.controls.scale_lr.value = "sqrt"
    assert "learning rate 0.006 (sqrt rule" in panel.readout.value


def test_invalid_batch_size_shows_the_config_error_and_run_starts_nothing(make_panel):
    panel = make_panel()
    panel.controls.batch_size.value = "lots"
    assert panel.status_text == "invalid training configuration: batch_size='lots': a whole number from 1 to 16777216"
    assert panel.readout.value == ""
    panel.run_button.click()
    assert panel.runs == [] and not panel.running
    assert "batch_size='lots'" in panel.status_text and "#b00020" in panel.status.value
    panel.controls.batch_size.value = "48"  # free entry, not a power of two
    assert panel.status_text.startswith("ready")
    assert "global batch 48" in panel.readout.value


def test_an_invalid_combination_names_every_problem_in_the_status_line(make_panel):
    panel = make_panel()
    panel.controls.base_batch.value = ""
    panel.controls.scale_lr.value = "linear"
    panel.controls.max_steps.value = "0"
    panel.controls.workers.value = 3
    panel.controls.batch_size.value = "0"
    assert panel.status_text == ("invalid training configuration\n"
                                 "  batch_size='0': a whole number from 1 to 16777216\n"
                                 "  max_steps='0': a whole number >= 1, or None / -1 for no step limit")
    panel.controls.batch_size.value = "16"
    panel.controls.max_steps.value = ""
    assert panel.status_text == ("invalid training configuration: scale_lr='linear': needs base_batch_size "
                                 "(the global batch the learning rate was tuned for)")
    panel.apply_button.click()
    assert panel.status_text.startswith("invalid training configuration: scale_lr='linear'")


def test_unavailable_device_and_precision_are_disabled_with_the_configs_reason(make_panel):
    with hardware.assume(NO_GPU):
        panel = make_panel()
    device, precision = panel.controls.device, panel.controls.precision
    assert device.value == "cpu" and not device.buttons["cpu"].disabled
    assert device.buttons["cuda"].disabled
    assert device.buttons["cuda"].tooltip.startswith(
        "Not available on this machine; available: cpu. Train on a CUDA GPU.")
    assert "<b>cuda</b>: not available on this machine" in device.reasons.value
    assert precision.buttons["16-mixed"].disabled
    assert precision.buttons["16-mixed"].tooltip.startswith("16-mixed needs a CUDA GPU")
    assert "(precision). Checklist: 16-bit mixed precision" in precision.buttons["16-mixed"].tooltip
    assert not precision.buttons["bf16-mixed"].disabled and not precision.buttons["32-true"].disabled
    with hardware.assume(NO_GPU):  # a disabled choice set from code still meets config.py's check
        precision.select("16-mixed")
    assert panel.status_text == ("invalid training configuration: precision='16-mixed': 16-mixed needs a CUDA GPU "
                                 "(it uses a GradScaler); on cpu use 32-true or bf16-mixed")
    panel.run_button.click()
    assert panel.runs == []


def test_choice_buttons_act_as_one_choice(make_panel):
    panel = make_panel()
    precision = panel.controls.precision
    precision.buttons["bf16-mixed"].value = True
    assert precision.value == "bf16-mixed"
    assert [b.value for b in precision.buttons.values()] == [False, False, True]
    precision.buttons["bf16-mixed"].value = False  # unpressing the chosen one keeps it chosen
    assert precision.value == "bf16-mixed" and precision.buttons["bf16-mixed"].value
    assert "bf16-mixed on cpu" in panel.readout.value


def test_apply_now_during_a_run_changes_the_batch_at_the_next_step_on_the_same_model_and_optimizer(make_panel):
    recipe = digits_recipe()
    panel = make_panel(recipe)
    start_long_run(panel)
    engine, optimizer = panel.engine, panel.engine.optimizer
    panel.controls.batch_size.value = "128"
    assert panel.status_text == "changed: press Apply now to use this from the next optimizer step"
    assert engine.config.batch_size == 32  # nothing changes before Apply now
    panel.apply_button.click()
    assert panel.status_text.startswith(("requested batch_size 32 → 128; it applies at the next optimizer step",
                                         "applied at step"))  # the training thread may be that quick
    wait_until(lambda: panel.runs[0].log.of_type("change"))
    change = panel.runs[0].log.of_type("change")[0]
    assert change["changes"] == {"batch_size": [32, 128]}
    wait_until(lambda: panel.status_text.startswith("applied"))
    assert panel.status_text == (f"applied at step {change['step']}: batch_size 32 → 128 "
                                 "(same model and optimizer)")
    assert engine.running and engine.config.batch_size == 128
    assert panel.engine is engine and engine.optimizer is optimizer and engine.model is recipe.model
    adam_steps = optimizer.state[next(recipe.model.parameters())]["step"].item()
    assert adam_steps >= change["step"]  # the optimizer's state carried over the change
    panel.stop_button.click()
    assert panel.wait(30)
    assert panel.runs[0].status == "stopped"


def test_stop_ends_the_run_at_a_step_boundary_and_says_where(make_panel):
    panel = make_panel()
    start_long_run(panel)
    panel.stop_button.click()
    assert panel.status_text.startswith(("stopping run #1 at the next optimizer step…", "run #1 stopped"))
    assert panel.wait(30)
    steps = panel.engine.step
    assert re.fullmatch(rf"run #1 stopped after {steps:,} of 45,000 steps \(epoch \d+, \d+ samples into it\) — .*",
                        panel.status_text, flags=re.S), panel.status_text  # 1437 samples / 32 = 45 steps/epoch
    assert steps < 45 * 1000 and not panel.engine.running
    assert f"run #1 stopped at step {steps:,} of 45,000 · " in text_of(panel.progress.value)
    assert panel.progress.bar.value == steps and panel.progress.bar.bar_style == "warning"
    assert panel.runs[0].result.summary.run_steps == steps
    panel.stop_button.click()
    assert panel.status_text == "no run in progress"


def test_a_stopped_run_states_one_step_count_in_its_status_progress_and_table_row(make_panel):
    panel = make_panel()
    panel.controls.max_steps.value = "5"
    panel.run_button.click()
    assert panel.wait(60)
    panel.controls.max_steps.value = ""
    start_long_run(panel)  # the model trained 5 steps before this run
    panel.stop_button.click()
    assert panel.wait(30)
    steps = panel.runs[1].result.summary.run_steps
    assert panel.engine.step == 5 + steps
    assert panel.status_text.startswith(f"run #2 stopped after {steps:,} of 45,000 steps (epoch "), panel.status_text
    assert f"the model's step {5 + steps:,} overall)" in panel.status_text  # where the model stands, said apart
    assert f"run #2 stopped at step {steps:,} of 45,000" in text_of(panel.progress.value)
    assert panel.progress.bar.value == steps
    assert row_cells(panel, 2)[3] == f"{steps:,}"


def test_the_progress_bar_counts_this_runs_steps_with_elapsed_and_remaining_time(make_panel):
    panel = make_panel()
    start_long_run(panel)
    wait_until(lambda: "left" in text_of(panel.progress.value))
    text = text_of(panel.progress.value)
    assert re.fullmatch(r"run #1 · step [\d,]+ of 45,000 · \d+:\d\d elapsed · about [\d:]+ left · loss [\d.]+",
                        text), text
    assert panel.progress.bar.max == 45000 and 0 < panel.progress.bar.value <= panel.engine.step
    panel.stop_button.click()
    assert panel.wait(30)


def test_every_control_has_a_tooltip_with_what_it_does_and_the_checklists_rule(make_panel):
    panel = make_panel()
    controls = panel.controls
    for option, widget in controls.fields.items():
        assert f"({option})" in widget.tooltip, (option, widget.tooltip)  # the option's own word
    for option in ("batch_size", "accumulate_grad_batches", "num_workers", "devices", "scale_lr", "compile"):
        assert "Checklist: " in controls.fields[option].tooltip, option
    labels = {w.value: w.tooltip for w in descendants(controls.widget) if isinstance(w, widgets.Label)}
    assert "(devices)" in labels["devices"] and not hasattr(controls, "processes")  # Lightning's word, the only one
    assert "DDP" in controls.devices.tooltip and "not DataParallel" in controls.devices.tooltip
    for row in (controls.device, controls.precision):
        assert all(button.tooltip for button in row.buttons.values())
    tools = set(map(id, descendants(panel.tools.widget)))  # the tools' own controls: panel_tools.py's part
    interactive = (widgets.Button, widgets.ToggleButton, widgets.ValueWidget)
    untold = [w for w in descendants(panel.widget) if isinstance(w, interactive) and id(w) not in tools
              and not isinstance(w, (widgets.HTML, widgets.Label, widgets.IntProgress, widgets.Image))
              and not w.tooltip]
    assert untold == []


def test_copy_as_code_shows_the_settings_as_a_magic_line_and_a_trainconfig(make_panel):
    panel = make_panel()
    assert panel.code.html.layout.display == "none"  # folded until asked for
    panel.code.toggle.value = True
    assert panel.code.html.layout.display is None
    panel.controls.batch_size.value = "64"
    panel.controls.precision.select("bf16-mixed")
    text = text_of(panel.code.html.value)
    assert panel.config.as_flags() == ("%%nbtrain --accelerator cpu --precision bf16-mixed --batch-size 64 "
                                       "--base-batch-size 32")
    assert text == panel.config.as_flags() + panel.config.as_code()  # two blocks: one click selects each
    assert eval(panel.config.as_code(), {"TrainConfig": nbtrain.TrainConfig}) == panel.config  # it round-trips
    panel.controls.batch_size.value = "lots"
    assert "invalid" in text_of(panel.code.html.value)


def test_copy_as_code_states_what_the_panel_changed_even_back_to_a_default(make_panel):
    from torch.utils.data import DataLoader
    from nbtrain.demo import DigitsDataset, DigitsMLP
    recipe = Recipe(model=DigitsMLP(), train_data=DataLoader(DigitsDataset(), batch_size=64, shuffle=True),
                    loss_fn=torch.nn.CrossEntropyLoss())
    panel = make_panel(recipe)
    assert panel.config.batch_size == 64  # the DataLoader's
    panel.controls.batch_size.value = "32"  # the default, set on purpose: it trains at 32, so the code says 32
    assert panel.config.batch_size == 32
    # The controls left alone (workers, precision, ...) are not stated; the loader's pin_memory=False is the run's.
    assert panel.config.as_flags() == ("%%nbtrain --accelerator cpu --batch-size 32 --pin-memory false "
                                       "--base-batch-size 64")
    assert panel.config.as_code() == ("TrainConfig(accelerator='cpu', batch_size=32, pin_memory=False, "
                                      "base_batch_size=64)")
    assert eval(panel.config.as_code(), {"TrainConfig": nbtrain.TrainConfig}).given == panel.config.given


def test_images_stay_hidden_until_they_have_a_frame(make_panel):
    panel = make_panel()
    for image in (panel.plot.image, panel.compare.image, panel.tools.image):
        assert image.layout.display == "none"  # an empty Image would show a broken-image icon
    panel.controls.max_steps.value = "12"
    panel.run_button.click()
    assert panel.wait(60)
    assert panel.plot.image.layout.display is None and bytes(panel.plot.image.value).startswith(b"\x89PNG")
    assert panel.compare.image.layout.display is None  # one run: its own bar
    panel.compare.select.value = ()
    assert panel.compare.image.layout.display == "none"


def run_twice(panel, steps: str, second_batch: str) -> None:
    """Two runs from the panel's buttons: `steps` steps, then the same with another batch size."""
    panel.controls.max_steps.value = steps
    panel.run_button.click()
    assert panel.wait(60)
    panel.controls.batch_size.value = second_batch
    panel.run_button.click()
    assert panel.wait(60)


def test_runs_table_shows_what_differs_first_and_folds_the_rest(make_panel):
    panel = make_panel()
    run_twice(panel, "12", "64")
    assert row_cells(panel, 2)[1] == "batch_size=64"
    assert "<tr class='nbtrain-run-details'" not in panel.table.html.value
    panel.table.details.value = True
    details = re.findall(r"<tr class='nbtrain-run-details' data-run='(\d)'>(.*?)</tr>", panel.table.html.value)
    assert [number for number, _ in details] == ["1", "2"]
    assert "global batch 64 = batch 64 × accumulate 1 × 1 device" in text_of(details[1][1])
    assert "held-out" in panel.table.html.value and "samples/s (95% interval)" in panel.table.html.value


def test_a_second_run_while_one_is_going_is_refused_in_the_status_line(make_panel):
    panel = make_panel()
    start_long_run(panel)
    panel._on_run()  # the button is disabled in the browser; the logic refuses too
    assert panel.status_text == "run #1 is still going: Stop it, or Apply now to change it"
    assert len(panel.runs) == 1


def test_changing_processes_inside_a_run_is_refused_with_the_engines_reason(make_panel):
    panel = make_panel()
    start_long_run(panel)
    assert panel.controls.devices.disabled
    panel.controls.devices.value = 2
    panel.apply_button.click()
    assert panel.status_text == ("ValueError: devices cannot change inside a running process; "
                                 "start a new run with them instead")
    assert panel.engine.running and panel.engine.config.devices == 1
    assert "Traceback" in panel.errors[-1]


def test_a_failing_training_step_is_reported_in_the_status_line_and_the_runs_table(make_panel):
    recipe = digits_recipe()

    def training_step(model, batch):
        raise RuntimeError("the model's forward failed on purpose")

    broken = Recipe(model=recipe.model, train_data=recipe.train_data, training_step=training_step)
    panel = make_panel(broken)
    panel.run_button.click()
    assert panel.wait(30)
    assert panel.status_text == "run #1 failed: RuntimeError: the model's forward failed on purpose"
    assert "data-status='failed'" in panel.table.html.value
    assert "RuntimeError" in panel.errors[-1]
    assert not panel.run_button.disabled  # the panel stays usable


def test_a_new_panel_for_the_same_model_stops_the_old_ones_run(make_panel):
    recipe = digits_recipe()
    first = make_panel(recipe)
    start_long_run(first)
    second = make_panel(recipe)
    assert not first.running and not first.engine.running
    assert first.runs[0].status == "stopped"
    assert second.engine is first.engine  # the same live model and optimizer
    assert first.widget.comm is None  # the old panel's widgets are closed


def test_close_stops_the_run_and_closes_the_widgets(make_panel):
    panel = make_panel()
    start_long_run(panel)
    panel.close_button.click()
    assert not panel.running and panel.runs[0].status == "stopped"
    assert panel.widget.comm is None and panel.run_button.comm is None


def test_live_plot_and_compare_view_are_drawn_from_measured_runs(make_panel):
    panel = make_panel()
    run_twice(panel, "15", "128")
    assert bytes(panel.plot.image.value).startswith(b"\x89PNG")
    assert panel.compare.select.value == (1, 2)
    from nbtrain.runs.apart import versus, withheld
    first, second = panel.runs[0].result, panel.runs[1].result
    # the comparison table's rule: runs too short, or a load that could explain it, get no speed verdict
    held = withheld(("#1", first), ("#2", second))
    said = f"batch_size=128: {held}" if held else versus(first, second).text("batch_size=128")
    text = text_of(panel.compare.summary.value)
    assert text.startswith("#2 vs #1: " + said), text
    assert any(words in text for words in ("faster", "slower", "no measurable difference", "too few", "too short",
                                           "the machine was"))
    assert any(words in text for words in ("measured at different times", "taken at different times", "same code and data"))
    assert bytes(panel.compare.image.value).startswith(b"\x89PNG")
    panel.compare.select.value = (2,)
    assert text_of(panel.compare.summary.value) == "#2 alone"


def test_further_toggles_apply_and_say_why_one_does_not_apply_here(make_panel):
    panel = make_panel(config=nbtrain.TrainConfig(accelerator="cpu"))
    panel.controls.optimizer_impl.value = "foreach"
    panel.controls.matmul.value = "high"
    panel.controls.max_steps.value = "3"
    panel.run_button.click()
    assert panel.wait(60)
    assert (panel.engine.config.optimizer_impl, panel.engine.config.matmul_precision) == ("foreach", "high")
    assert panel.status_text.endswith("\nnote: matmul_precision=high: not applicable on cpu (TF32 is a CUDA feature)")


def test_panel_reads_a_namespace_and_names_what_it_accepts(make_panel):
    recipe = digits_recipe()
    panel = make_panel({"model": recipe.model, "train_data": recipe.train_data, "loss_fn": recipe.loss_fn})
    assert panel.recipe.model is recipe.model
    with pytest.raises(TypeError, match=r"got int; allowed: a nbtrain.Recipe, a namespace dict"):
        nbtrain.panel(42, display=False)
    with pytest.raises(nbtrain.RecipeError, match="the namespace defines no model"):
        nbtrain.panel({"train_data": recipe.train_data}, display=False)


@pytest.mark.slow
def test_processes_above_one_run_through_the_ddp_launcher(make_panel):
    recipe = digits_recipe()
    panel = make_panel(recipe, nbtrain.TrainConfig(accelerator="cpu"))
    before = [p.detach().clone() for p in recipe.model.parameters()]
    panel.controls.devices.value = 2
    panel.controls.max_steps.value = "4"
    assert "× 2 devices" in panel.readout.value
    panel.run_button.click()
    assert panel.wait(240), panel.status_text
    assert panel.runs[0].status == "completed", panel.status_text
    assert panel.runs[0].result.config.world_size == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, recipe.model.parameters()))


@pytest.mark.slow
def test_stop_ends_a_multi_process_run_and_refuses_live_changes_to_it(make_panel):
    panel = make_panel()
    panel.controls.devices.value = 2
    panel.controls.max_epochs.value = "1000"
    panel.run_button.click()
    wait_until(lambda: len(panel.runs[0].log) > 0, timeout=120)
    panel.controls.batch_size.value = "64"
    panel.apply_button.click()
    assert panel.status_text == ("a multi-process run cannot change while it runs: "
                                 "Stop it and Run again with the new settings")
    before = [p.detach().clone() for p in panel.recipe.model.parameters()]
    panel.stop_button.click()
    assert panel.status_text.startswith(("stopping run #1 on every device", "run #1 stopped"))
    assert panel.wait(60)
    assert panel.runs[0].status == "stopped", panel.status_text
    assert panel.status_text.startswith("run #1 stopped"), panel.status_text
    # Every rank stopped after the same step (else the survivors would hang in an all-reduce), and the
    # weights trained so far came back into the kernel's model.
    assert panel.runs[0].result.extras["weights_loaded"] is True
    assert any(not torch.equal(a, b) for a, b in zip(before, panel.recipe.model.parameters()))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_moving_a_running_model_to_the_gpu_with_16_mixed_applies_at_the_next_step(make_panel):
    recipe = digits_recipe()
    panel = make_panel(recipe, nbtrain.TrainConfig(accelerator="cpu"))
    start_long_run(panel)
    panel.controls.device.select("cuda")
    panel.controls.precision.select("16-mixed")
    panel.apply_button.click()
    wait_until(lambda: panel.engine.config.accelerator == "cuda")
    wait_until(lambda: panel.status_text.startswith("applied"))
    assert next(recipe.model.parameters()).device.type == "cuda"
    assert panel.engine.precision.scaler.is_enabled()
    panel.stop_button.click()
    assert panel.wait(30) and panel.runs[0].status == "stopped"
    assert panel.errors == []
