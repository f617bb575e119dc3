"""`nbtrain.slurm.export`: a recipe as a standalone script plus its sbatch file, off the notebook.

The folder is a run directory (rundir.py) with two entry points beside it:

    train.py       python train.py            trains here in one process, writes model.pt
                   torchrun ... train.py      one DDP rank (what the sbatch file runs)
    train.sbatch   sbatch train.sbatch        num_nodes x devices through SLURM (slurm_script.py)

The recipe travels as recipe.pkl (cloudpickle), so classes defined in a notebook come along.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..config import TrainConfig
from ..distributed.plan import for_batch_job
from ..distributed.rundir import CONFIG, LAUNCH, RECIPE, RunDir
from .script import SIGNAL_DEFAULT, sbatch_script

TRAIN_PY = '''#!/usr/bin/env python3
"""{title}: a training recipe exported by nbtrain; config.json and recipe.pkl sit beside this file.

    python train.py              train here, in this process (the weights go to model.pt)
    sbatch train.sbatch          train on SLURM: {nodes} node(s) x {devices} process(es), torchrun + c10d
    torchrun --nproc-per-node=N train.py    DDP on this machine
"""
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def train_here() -> int:
    from nbtrain import Engine, MetricsLog
    from nbtrain.progress import Progress
    from nbtrain.distributed.rundir import RunDir

    run = RunDir(HERE)
    config = run.config().replace(devices=1, num_nodes=1)  # one process: DDP runs go through torchrun
    engine = Engine(run.recipe(), config)
    log = MetricsLog()
    log.subscribe(Progress())
    result = engine.run(log=log)
    print(result.table())
    run.save_model({{k: v.detach().cpu() for k, v in engine.model.state_dict().items()}})
    print(f"weights: {{HERE / 'model.pt'}}")
    return 0 if result.status == "completed" else 1


def main() -> int:
    if "LOCAL_RANK" in os.environ:  # started by torchrun: one rank of the DDP job
        from nbtrain.distributed.worker import main as worker
        return worker([str(HERE)])
    return train_here()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # like the worker: a finished rank does not wait on its peers' sockets
'''


def export(recipe, config: TrainConfig, folder, *, job_name: str = "nbtrain", python: str | None = None,
           requeue_signal: str | None = SIGNAL_DEFAULT, socket_ifname: str | None = "auto",
           **sbatch_options) -> Path:
    """Write train.py and train.sbatch (and the recipe and config they read) into `folder`; the sbatch path."""
    folder = Path(folder).resolve()
    if folder.exists() and any((folder / name).exists() for name in (CONFIG, RECIPE, "train.py")):
        raise FileExistsError(f"export folder {folder} already holds an exported recipe; choose a new folder")
    script_py = folder / "train.py"
    plan = for_batch_job(config)  # runs on its own, owned by nobody's kernel
    batch = sbatch_script(plan, str(folder), python=python or sys.executable, job_name=job_name,
                          options=sbatch_options, requeue_signal=requeue_signal, socket_ifname=socket_ifname,
                          target=[str(script_py)])
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = RunDir.create(plan, config=config, recipe=recipe, parent=str(folder))
    for name in (CONFIG, RECIPE, LAUNCH):
        os.replace(tmp.path / name, folder / name)
    tmp.remove()
    script_py.write_text(TRAIN_PY.format(title=job_name.replace("\\", "/").replace('"', "'"), nodes=config.num_nodes,
                                         devices=config.devices))
    script_py.chmod(0o700)
    (folder / "train.sbatch").write_text(batch)
    return folder / "train.sbatch"
