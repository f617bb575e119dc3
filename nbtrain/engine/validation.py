"""Epoch ends and held-out evaluation (each epoch or every N steps), feeding early stopping."""
from __future__ import annotations

from . import evaluation, fsdp
from ..records import EpochEvent


class Validation:
    """Part of Engine (engine.py): epoch ends and held-out evaluation (each epoch or every n steps), feeding early stopping."""

    def _end_epoch(self) -> None:
        self._flush()
        if self.schedule is not None and self.schedule.interval == "epoch":
            self.schedule.step(self.optimizer)
            self.set_lr(self.step)
        self.epoch += 1
        self.epoch_offset = 0
        event = EpochEvent(type="epoch", epoch=self.epoch, step=self.step)
        if self.recipe.val_data is not None and self._validates and not self.config.val_every_n_steps:
            with self._clock.paused():
                event.update(self._validate(emit=False))
        self.log.emit(event)

    @property
    def _validates(self) -> bool:
        # A sharded model's forward gathers parameters from every rank, so every rank validates.
        return self.world.is_main or fsdp.is_sharded(self.model)

    def evaluate(self, dataset) -> dict:
        """Held-out numbers of the live model on `dataset` (see evaluation.py)."""
        return evaluation.evaluate(self, dataset)

    _validated_at: int | None = None

    def _validate(self, emit: bool = True, closing: bool = False) -> dict:
        """Held-out numbers now; `closing`: the report of a run ending mid-epoch, which a plateau schedule
        does not step on (a run continued in the next call then steps where one longer run would)."""
        numbers = self.evaluate(self.recipe.val_data)
        self._validated_at = self.step
        if emit:
            self.log.emit(EpochEvent(type="epoch", epoch=self.epoch, step=self.step, partial=True, **numbers))
        if self.schedule is not None and self.schedule.on_plateau and not closing:
            self.schedule.step_on(numbers, self.config, self.optimizer)
            self.set_lr(self.step)
        if self._monitor is not None and self._monitor.update(numbers, self.step, self.model):
            self.stop("failed" if self._monitor.problem else "early_stopped")
        return numbers

    def _validate_now(self) -> None:
        """A held-out evaluation between steps (val_every_n_steps), kept out of the training clock."""
        self._flush()
        if self._validates:
            with self._clock.paused():
                self._validate()

    def _end_stream_pass(self, micro: int) -> None:
        """A stream ended: a half-accumulated window is dropped (its gradients would be scaled for a full one)."""
        if micro:
            self.model.zero_grad(set_to_none=True)
            self._note("stream", f"the stream's last {micro} batch(es) of an accumulation window were dropped at "
                       "the end of a pass")
        self._after_boundary()
