"""What a run states about itself: its log windows (losses read back once each), its plan, its device
and strategy, compile costs."""
from __future__ import annotations

import math
import statistics

import torch

from . import data, fsdp
from ..format import ratio as ratio_text
from ..records import EngineInfo, LoggedEvent, StepsEvent


class RunReport:
    """Part of Engine (engine.py): what a run states about itself: its plan, its device and strategy, compile costs."""

    def _compile_accounting(self, extra: dict) -> list[str]:
        """Compile time apart from step time, and the step count at which compiling pays off."""
        steps = self.log.columns["step_s"]
        if len(steps) < 3:
            return []
        steady = statistics.median(steps[1:])
        if self.config.compile == "none":
            self._eager_step_s = steady
            return []
        if not self._compiled_fresh:
            return []
        self._compiled_fresh = False
        # Everything above the steady step time is compilation (the first step, and any recompiles).
        # Never below zero: with the graph already cached (another model of the class compiled in this
        # process) there is no cost to see, only the steps' own noise.
        cost = max(sum(steps) - steady * len(steps), 0.0)
        extra["compile_s"] = cost
        note = (f"compile cost {cost:.1f} s" if cost >= 0.05 else "compile cost none to see (already cached)") \
            + f"; compiled step {1000 * steady:.2f} ms"
        if self._eager_step_s is None:
            return [note + "; run once without compile on this model to see when it pays off"]
        gain = self._eager_step_s - steady
        if gain <= 0:
            return [note + f" vs {1000 * self._eager_step_s:.2f} ms eager: no speed-up at this size, it never pays off"]
        pays = f"pays off after ~{math.ceil(cost / gain):,} steps" if cost >= 0.05 else "pays off at once"
        return [note + f" vs {1000 * self._eager_step_s:.2f} ms eager ({ratio_text(self._eager_step_s / steady)}): {pays}"]

    def _planned_steps(self) -> int:
        c = self.config
        if self.loader.sampler.per_epoch is None:
            passes = getattr(self.loader, "batches_per_pass", None)
            by_epochs = math.ceil(passes() / c.accumulate_grad_batches) * c.epochs_budget \
                if passes is not None and c.epochs_budget is not None else None
            return min(x for x in (by_epochs, c.max_steps) if x is not None)
        per_epoch = math.ceil(len(data.batch_sizes(self.loader.sampler.per_epoch, self.loader.batch_size, c.drop_last))
                              / c.accumulate_grad_batches)
        by_epochs = per_epoch * c.epochs_budget if c.epochs_budget is not None else None
        return min(x for x in (by_epochs, c.max_steps) if x is not None)

    def _info(self) -> EngineInfo:
        c = self.config
        return EngineInfo(device=str(self.device), strategy=self._strategy(), world_size=self.world.size,
                          global_batch=c.global_batch_size,
                          lr=self._target_lrs()[0], lr_note=self.lr_note(), precision=c.precision,
                          scaler=self.precision.scaler.is_enabled(), pin_memory=c.pin, seed=self.seed)

    def _strategy(self) -> str:
        if fsdp.is_sharded(self.model):
            return "fsdp"
        if self.config.strategy == "dp" and self.device.type == "cuda":
            return "dp"
        return "ddp" if self.world.distributed else "single process"

    _ROW = ("step", "epoch", "samples", "time", "lr", "step_s", "data_s", "h2d_s", "forward_s", "backward_s",
            "optimizer_s")

    def _flush(self) -> None:
        """Emit the buffered steps, reading their losses back in one transfer."""
        if not self._losses:
            return
        columns = {name: list(values) for name, values in zip(self._ROW, zip(*self._rows))}
        columns["loss"] = torch.stack(self._losses).float().tolist()  # the one host<->device sync per window
        if self._nonfinite is None and self.config.on_nonfinite_loss == "stop":
            bad = next(((s, v) for s, v in zip(columns["step"], columns["loss"]) if not math.isfinite(v)), None)
            if bad is not None:
                self._nonfinite = bad
                self.stop("failed")
        self._rows.clear()
        self._losses.clear()
        self.log.emit(StepsEvent(type="steps", rows=columns))
        logged = self.recipe.logged.drain() if self.recipe.logged is not None else None
        if logged:  # the user's own self.log(...) values, read back with the losses
            self._logged.update(logged)
            self.log.emit(LoggedEvent(type="logged", step=self.step, values=logged))
