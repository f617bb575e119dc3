"""The panel's run, in its background thread: train, record, and keep the views in step with it.

Everything here runs in the run's thread (the events come from the training loop), so it
only assigns widget values, which ipywidgets sends safely from any thread, and keeps what
it does per event small.
"""
from __future__ import annotations

import traceback

from ..runs.result import RunResult
from ..format import number
from ..records import StartInfo, start_info
from .panel_runs import RunRecord


def train(panel, record: RunRecord) -> None:
    """Run `record` on the panel's live model; the status line says how it ended, whatever happens."""
    message, error = "", False
    try:
        # The live engine of one device is the panel's own (engine_for gives fit the same one), so
        # "Apply now" reaches this run; more devices are DDP workers.
        result = panel.session.train(panel.recipe, record.config, record.log, stop=record.stop)
        record.result, record.status = result, result.status
        panel.progress.end(result.status, record.steps)
        # The status line says how the run ended; the progress line where it was recorded.
        panel.progress.add_note(" · " + panel.session.record(result, panel.recipe.model)[-1])
        message = outcome_text(record, result, panel.engine if record.config.world_size == 1 else None)
    except BaseException as exc:  # KeyboardInterrupt included (a kernel interrupt)
        panel.errors.append(traceback.format_exc())
        record.status, record.error = "failed", f"{type(exc).__name__}: {exc}"
        message, error = f"run #{record.number} failed: {record.error}", True
        panel.progress.end("failed")
    finally:
        try:
            panel.plot.finish()
            if panel.plot.error:
                message += f" ({panel.plot.error})"
            panel.table.show(panel.runs)
            panel.compare.offer(panel.runs)  # the new selection redraws the compare view
            panel.set_running(False)
        except Exception as exc:
            panel.errors.append(traceback.format_exc())
            message, error = f"{message}; updating the panel failed: {exc!r}", True
        panel.say(message, error=error)


def on_event(panel, record: RunRecord, event: dict, log) -> None:
    """A MetricsLog view: the progress follows the steps, the status line a change applied mid-run."""
    kind = event["type"]
    if kind == "change":
        panel.say(f"applied at step {event['step']}: {describe(event['changes'])} (same model and optimizer)")
    elif kind == "start":
        panel.progress.start(record.number, StartInfo.from_dict(event["info"]).planned_steps)
        panel.table.show(panel.runs)
        how = ("Stop ends its worker processes" if record.config.world_size > 1
               else "Stop ends it at the next optimizer step; Apply now changes it there")
        panel.say(f"run #{record.number} training: {record.settings_text()}. {how}")
    elif kind == "steps" and event["rows"]["step"]:
        rows = event["rows"]
        panel.progress.steps(rows["step"][-1] - start_info(log).step_start, rows["loss"][-1])


def outcome_text(record: RunRecord, result: RunResult, engine=None) -> str:
    """The status line after a run. Its step count is the run's own, the one the progress line and the
    runs table state; where the model stands overall (it may have trained before) is said apart, from
    `engine` (the kernel's engine, for a run that trained in this kernel)."""
    s, steps = result.summary, record.steps
    head = f"run #{record.number} {result.status} after {steps:,} steps"
    if result.status in ("stopped", "interrupted") and engine is not None:
        planned = start_info(record.log).planned_steps
        overall = f"; the model's step {engine.step:,} overall" if engine.step != steps else ""
        head = (f"run #{record.number} {result.status} after {steps:,}{f' of {planned:,}' if planned else ''} steps"
                f" (epoch {engine.epoch}, {engine.epoch_offset} samples into it{overall})")
    elif result.message:
        head += f": {result.message}"
    return (f"{head} — {result.steady().text()}, final loss {number(s.last_loss)}"
            + "".join(f"\nnote: {note}" for note in s.notes))


def describe(changes: dict) -> str:
    """{'batch_size': (32, 128)} -> 'batch_size 32 → 128'."""
    return ", ".join(f"{name} {old} → {new}" for name, (old, new) in changes.items())
