"""The parts of scripts/gpu-check.sh that are Python: each prints what a report quotes, exits 1 on failure.

    python scripts/gpu_check_parts.py sequence     # train on the GPU in this process, then devices=2
    python scripts/gpu_check_parts.py walk         # the checklist walk on a small conv net, its table
    python scripts/gpu_check_parts.py notebook 05  # execute notebooks/src/05-*.py in a kernel (no server)

Without a CUDA device each part says "skipped: ..." and exits 0, so the script is a dry check on a CPU.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _gpus() -> int:
    import torch
    return torch.cuda.device_count()  # NVML's count: asking initialises nothing


def _rank_parent():
    import os as rank_os
    return rank_os.getppid()


def sequence() -> int:
    """The notebook launchers' failure: this process trains on the GPU (CUDA initialised here), then DDP."""
    import torch
    import nbtrain
    from nbtrain import TrainConfig
    from nbtrain.demo import digits_recipe
    from nbtrain.distributed.pool import ZYGOTE
    if not _gpus():
        print("skipped: no CUDA device here (the sequence needs one to initialise CUDA in this process)")
        return 0
    recipe = digits_recipe(seed=0)
    first = nbtrain.fit(recipe=recipe, config=TrainConfig(accelerator="cuda", batch_size=32, max_steps=20))
    print(f"in this process on {first.summary.device}: {first.status}, CUDA initialised here: "
          f"{torch.cuda.is_initialized()}")
    parent = nbtrain.launch(_rank_parent, nprocs=2, backend="gloo")
    forked = parent in ZYGOTE.pids()
    print(f"ranks started by {'the zygote (forked)' if forked else 'this process (fresh interpreters)'}")
    backend = "nccl" if _gpus() >= 2 else "gloo"
    accelerator = "cuda" if backend == "nccl" else "cpu"
    t0 = time.monotonic()
    then = nbtrain.fit(recipe=recipe, config=TrainConfig(devices=2, accelerator=accelerator, batch_size=16,
                                                         max_steps=20))
    print(f"then devices=2 ({backend} ranks on {accelerator}): {then.status}, world size "
          f"{then.summary.world_size}, on {then.summary.device}, {time.monotonic() - t0:.1f} s")
    return 0 if first.status == then.status == "completed" and forked else 1


def walk() -> int:
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    import nbtrain
    from nbtrain import Recipe, TrainConfig
    if not _gpus():
        print("skipped: no CUDA device here")
        return 0
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(4096, 3, 32, 32, generator=g), torch.randint(0, 10, (4096,), generator=g))
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    recipe = Recipe(model=model, train_data=data, loss_fn=nn.CrossEntropyLoss(),
                    optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
    result = nbtrain.checklist(recipe, config=TrainConfig(accelerator="cuda", batch_size=32), budget_s=40)
    print(result.table())
    return 0


def notebook(prefix: str) -> int:
    missing = [name for name in ("nbformat", "nbclient", "ipykernel") if not _importable(name)]
    if missing:
        print(f"skipped: Jupyter packages missing: {', '.join(missing)} (the README's install brings them; "
              "nothing is installed here)")
        return 0
    if not _gpus():
        print("skipped: no CUDA device here (its [GPU] cells would be skipped)")
        return 0
    sys.path.insert(0, str(ROOT / "notebooks"))
    import build
    [source] = build.sources([prefix])
    nb = build.build(source)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nbtrain-gpu-check-") as work:
        try:
            build.execute(nb, Path(work))
        except Exception as error:  # noqa: BLE001 - the report quotes the cell's error
            print(f"{source.name}: FAILED after {time.monotonic() - t0:.0f} s:\n{error}")
            return 1
    print(f"{source.name}: every cell ran, {time.monotonic() - t0:.0f} s; its text output:")
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            text = output.get("text") or output.get("data", {}).get("text/plain", "")
            if text:
                print("  " + "".join(text).rstrip().replace("\n", "\n  "))
    return 0


def _importable(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    part, *rest = sys.argv[1:] or ["?"]
    parts = {"sequence": sequence, "walk": walk, "notebook": notebook}
    if part not in parts:
        sys.exit(f"usage: python scripts/gpu_check_parts.py {{{'|'.join(parts)}}} [notebook prefix]")
    sys.exit(parts[part](*rest))
