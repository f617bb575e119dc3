"""`nbtrain.slurm.export`: a recipe as a standalone script plus its sbatch file, off the notebook.

An export, for users who submit with plain `sbatch` (no Python client, no submitit): this is
the one place nbtrain still writes a batch script. The folder is a run directory (rundir.py)
with two entry points beside it:

    train.py       python train.py            trains here in one process, writes model.pt
                   torchrun ... train.py      one DDP rank (what the sbatch file runs)
    train.sbatch   sbatch train.sbatch        num_nodes x devices: one torchrun agent per node

The recipe travels as recipe.pkl (cloudpickle), so classes defined in a notebook come along.
An exported job is not requeued on preemption: that is what `nbtrain.slurm.submit` (submitit)
does. Every value in the script is written with shlex.quote (sbatch undoes the quoting in
`#SBATCH` lines, bash in the body), so a name like `a'b $(rm -rf ~)` stays a plain string.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from ..config import TrainConfig
from .plan import LaunchPlan, for_batch_job
from .rundir import CONFIG, LAUNCH, RECIPE, RunDir
from .slurm_options import check_options

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
           **sbatch_options) -> Path:
    """Write train.py and train.sbatch (and the recipe and config they read) into `folder`; the sbatch path."""
    folder = Path(folder).resolve()
    if folder.exists() and any((folder / name).exists() for name in (CONFIG, RECIPE, "train.py")):
        raise FileExistsError(f"export folder {folder} already holds an exported recipe; choose a new folder")
    script_py = folder / "train.py"
    plan = for_batch_job(config)  # runs on its own, owned by nobody's kernel
    batch = _sbatch_script(plan, folder, python or sys.executable, job_name, check_options(sbatch_options), script_py)
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


def _sbatch_script(plan: LaunchPlan, folder: Path, python: str, job_name: str, options: dict, script: Path) -> str:
    """One torchrun agent per node, c10d rendezvous at the first node's address (NodeAddr: node names need
    not resolve), a port per job id; each rank's threads from the node's allocation."""
    q = shlex.quote
    header = [f"--job-name={job_name}", f"--nodes={plan.nodes}", "--ntasks-per-node=1",
              f"--output={folder}/slurm-%j.out", "--open-mode=append"]
    if plan.backend == "nccl":  # backend_for chose nccl: one GPU per rank
        header.append(f"--gpus-per-node={plan.procs_per_node}")
    header += [f"--{name.replace('_', '-')}" + ("" if value is True else f"={value}") for name, value in options.items()]
    lines = ["#!/bin/bash"] + [f"#SBATCH {q(h)}" for h in header] + [
        "# Exported by nbtrain for plain sbatch (nbtrain.slurm.submit goes through submitit instead).",
        "set -u",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        'head_addr=$(scontrol show node -o "$head_node" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)',
        'head_addr=${head_addr:-$head_node}',
        "port=$((20000 + SLURM_JOB_ID % 20000))",
        f'threads=$((${{SLURM_CPUS_ON_NODE:-{plan.procs_per_node}}} / {plan.procs_per_node}))',
        'export OMP_NUM_THREADS=$(( threads > 0 ? threads : 1 ))',
        'case "$head_addr" in 127.*|localhost) export GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo ;; esac',
        'echo "nbtrain: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous $head_addr:$port"',
        f'exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 {q(python)} -m torch.distributed.run \\',
        f'    --nnodes={plan.nodes} --nproc-per-node={plan.procs_per_node} --rdzv-backend=c10d \\',
        f'    --rdzv-endpoint="$head_addr:$port" --rdzv-id="$SLURM_JOB_ID" {q(str(script))}',
    ]
    return "\n".join(lines) + "\n"
