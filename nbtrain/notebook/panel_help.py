"""The panel's tooltips: what each control does (config.py's own words) and the checklist rule behind it.

What an option does is said once, in its config.py `Option.help`; the panel adds the
option's name (the word a Lightning user knows: `devices`, `accumulate_grad_batches`)
and the speed checklist's advice for it, so a tooltip teaches the item it controls.
"""
from __future__ import annotations

from ..config import options

# The speed checklist's rule for each option the panel shows.
RULES = {
    "accelerator": "Checklist: train on the GPU, move the model and data there once, and avoid host<->device "
                   "copies inside the loop.",
    "precision": "Checklist: 16-bit mixed precision (bf16-mixed, or 16-mixed with a GradScaler) speeds up GPUs "
                 "with tensor cores and halves activation memory; compare it with 32-true in the runs tab.",
    "batch_size": "Checklist: use the largest batch that fits (Find batch size in the tools tab), and scale the "
                  "learning rate with it (LR rule).",
    "accumulate_grad_batches": "Checklist: accumulate gradients to reach a large global batch when it does not fit "
                               "in memory at once.",
    "num_workers": "Checklist: load batches in DataLoader workers so the model never waits for data "
                   "(Find workers in the tools tab measures each count).",
    "num_threads": "Checklist (CPU): beside other work, or with workers and ranks sharing the cores, fewer torch "
                   "threads are often faster (threads waiting for a busy core stall each other); the walk races "
                   "counts. Empty: torch's own count.",
    "devices": "Checklist: for several GPUs use DDP (one process each, started fresh from this kernel), "
               "not DataParallel. Changes with the next Run.",
    "scale_lr": "Checklist: a larger batch wants a larger learning rate (linear or sqrt rule); check that the "
                "loss still falls, since the linear rule can diverge at large batches.",
    "base_batch_size": "The LR rule scales the rate by global batch / this number.",
    "lr": "Empty keeps the rate your optimizer was built with.",
    "max_epochs": "Empty: 1 epoch unless steps is set; whichever budget ends first ends the run.",
    "max_steps": "Empty: no step limit; whichever budget ends first ends the run.",
    "compile": "Checklist: compiling pays off on long runs; nbtrain measures its cost apart and says after how "
               "many steps it pays off.",
    "channels_last": "Checklist: convolutions run faster in channels-last layout on tensor cores, with mixed "
                     "precision.",
    "optimizer_impl": "Checklist: foreach or fused kernels update every parameter in a few launches instead of "
                      "one per tensor.",
    "matmul_precision": "Checklist: high or medium lets Ampere and newer GPUs use TF32 for float32 matrix "
                        "multiplies.",
    "find_unused_parameters": "Only when DDP's error asks for it: the search costs time every step.",
}

BUTTONS = {
    "run": "Train the live model with these settings, from where it is now (it keeps what it learned).",
    "stop": "Stop the run at the next optimizer step; the model keeps its training so far.",
    "apply": "Apply the changed settings to the running run at its next optimizer step, on the same model "
             "and optimizer (devices change with the next Run).",
    "close": "Stop any run and remove this panel.",
    "details": "Show every setting and measurement of each run.",
    "compare": "Runs to compare: loss against training time, and steady samples/s with its 95% interval.",
    "code": "These settings as a %%nbtrain line and a TrainConfig(...) expression: click the text to select it, "
            "then copy it.",
}

CHOICES = {
    "cpu": "Train on the CPU.",
    "cuda": "Train on a CUDA GPU.",
    "mps": "Train on the Apple-silicon GPU (MPS).",
    "32-true": "Full float32: the reference every speed-up is compared with.",
    "16-mixed": "float16 autocast with a GradScaler (CUDA GPUs).",
    "bf16-mixed": "bfloat16 autocast, no GradScaler needed (Ampere and newer GPUs, CPUs).",
}


def option_tooltip(option: str) -> str:
    """'<what it does> (<option name>). <the checklist's rule>'."""
    help_text = options()[option][0].help
    return f"{help_text[0].upper()}{help_text[1:]} ({option}). {RULES.get(option, '')}".strip()


def choice_tooltip(option: str, choice: str, reason: str | None = None) -> str:
    """A device or precision button: the choice, the option's rule, and why it is unavailable here."""
    words = f"{CHOICES.get(choice, choice)} {option_tooltip(option)}"
    return f"{reason[0].upper()}{reason[1:]}. {words}" if reason else words
