"""A terminal view of a run: a tqdm progress bar fed by the MetricsLog's events."""
from __future__ import annotations

from tqdm import tqdm


class ConsoleProgress:
    def __init__(self, file=None, disable: bool = False):
        self.file = file
        self.disable = disable
        self.bar = None

    def __call__(self, event: dict, log) -> None:
        kind = event["type"]
        if kind == "start":
            self.bar = tqdm(total=event["info"]["planned_steps"], unit="step", file=self.file,
                            disable=self.disable, dynamic_ncols=True)
        elif kind == "steps" and self.bar is not None:
            rows = event["rows"]
            self.bar.update(len(rows["step"]))
            span = rows["time"][-1] - rows["time"][0]
            done = rows["samples"][-1] - rows["samples"][0]
            rate = f"{(done / span):,.0f}" if span > 0 and len(rows["step"]) > 1 else "-"
            self.bar.set_postfix(loss=f"{rows['loss'][-1]:.4f}", samples_s=rate, refresh=False)
        elif kind == "epoch" and self.bar is not None and event.get("val_acc") is not None:
            self.bar.write(f"epoch {event['epoch']}: held-out loss {event['val_loss']:.4f}, "
                           f"accuracy {100 * event['val_acc']:.1f}%")
        elif kind == "end" and self.bar is not None:
            # The bar's last word is the summary's steady rate: one speed on the screen, not two.
            self.bar.set_postfix(loss=f"{event['summary'].get('last_loss', float('nan')):.4f}",
                                 samples_s=f"{event['summary'].get('samples_per_s', float('nan')):,.0f}", refresh=False)
            self.bar.close()
