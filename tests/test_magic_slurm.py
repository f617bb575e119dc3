"""%%nbtrain --slurm through a real IPython InteractiveShell: the dry run, the bad paths, one real job."""
import shlex
import subprocess

import pytest
import torch
from IPython.core.error import UsageError

from nbtrain.runs.store import RunStore

DIGITS = """
from nbtrain.demo import DigitsDataset, DigitsMLP
import torch
torch.manual_seed(0)
model = DigitsMLP(hidden=32)
train_data = DigitsDataset()
loss_fn = torch.nn.CrossEntropyLoss()
"""




def test_dry_run_shows_the_batch_script_for_the_flags_and_submits_nothing(ip, capsys, tmp_path):
    result = ip.run_cell("%%nbtrain --slurm-dry-run --num-nodes 2 --devices 1 --partition debug --time 00:10:00 "
                         "--sbatch exclusive --sbatch 'account=proj x' --name job_a" + DIGITS)
    out = capsys.readouterr().out
    assert result.error_in_exec is None, out
    script = ip.user_ns["_nbtrain_sbatch"]
    headers = [shlex.split(line[len("#SBATCH "):])[0] for line in script.splitlines() if line.startswith("#SBATCH")]
    assert {"--job-name=job_a", "--nodes=2", "--partition=debug", "--time=10", "--exclusive",
            "--account=proj x"} <= set(headers)
    assert "nothing was submitted" in out and "submitit.core._submit" in out
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not (tmp_path / ".nbtrain").exists() and "_nbtrain" not in ip.user_ns  # nothing written, nothing run


def test_the_dry_run_names_the_parts_from_an_earlier_cell_first(ip, capsys):
    assert ip.run_cell(DIGITS).error_in_exec is None
    result = ip.run_cell("%%nbtrain --slurm-dry-run --partition debug\nmodel = DigitsMLP(hidden=32)\n")
    out = capsys.readouterr().out
    assert result.error_in_exec is None, out
    assert out.startswith("train_data: DigitsDataset of 1,437 samples; loss_fn: CrossEntropyLoss() from earlier "
                          "cells\nnbtrain: the batch script"), out  # in the words of a run's header


def test_a_gpu_job_is_written_from_a_machine_without_a_gpu(ip, capsys):
    from nbtrain.hardware import Inventory, assume
    with assume(Inventory(cuda_devices=0, cuda_bf16=False, mps=False, cpu_cores=2)):  # a GPU-less login node
        result = ip.run_cell("%%nbtrain --slurm-dry-run --accelerator cuda --devices 4 --num-nodes 2 "
                             "--precision 16-mixed --partition gpu" + DIGITS)
    out = capsys.readouterr().out
    assert result.error_in_exec is None, out
    headers = [line for line in ip.user_ns["_nbtrain_sbatch"].splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --gpus-per-node=4" in headers and "#SBATCH --nodes=2" in headers
    assert "#SBATCH --partition=gpu" in headers


@pytest.mark.parametrize("line, expected", [
    ("--partition debug", "%%nbtrain: --partition applies to --slurm or --slurm-dry-run; allowed: add one of those"),
    ("--slurm --find-lr", "%%nbtrain: --slurm with --find-lr: allowed: one of them"),
    ("--slurm --sbatch nodes=3", "%%nbtrain: --sbatch: sbatch option nodes='3': not allowed here: set num_nodes / "
                                 "devices in the config"),
    ("--slurm-dry-run --sbatch 'Bad Name=1'", "%%nbtrain: --sbatch: sbatch option 'Bad Name': allowed: a long option"),
    ("--slurm-dry-run --sbatch time=1", "%%nbtrain: --sbatch time=1: allowed: --time 1 (its own flag)"),
    ("--slurm-dry-run --num-nodes 0", "%%nbtrain: invalid training configuration: --num-nodes=0"),
])
def test_bad_slurm_input_is_one_line_and_nothing_runs(ip, capsys, line, expected):
    result = ip.run_cell(f"%%nbtrain {line}\nran = True\n")
    out = capsys.readouterr()
    assert isinstance(result.error_in_exec, UsageError)
    text = out.out + out.err
    assert expected in text and "Traceback" not in text, text
    assert "ran" not in ip.user_ns


@pytest.mark.slow
def test_slurm_job_runs_the_cell_recipe_on_two_nodes_with_live_state_and_the_weights_come_back(
        ip, capsys, tmp_path, slurm_cluster):  # noqa: F811
    ip.run_cell(DIGITS)
    before = [p.detach().clone() for p in ip.user_ns["model"].parameters()]
    result = ip.run_cell("%%nbtrain --slurm --num-nodes 2 --devices 1 --accelerator cpu --max-steps 15 "
                         "--batch-size 64 --sbatch cpus_per_task=1 --no-plot --name job_b\nmodel = model\n")
    out = capsys.readouterr()
    assert result.error_in_exec is None, out.out + out.err
    job = ip.user_ns["job_b"]
    assert job is ip.user_ns["_nbtrain"] and job.status == "completed" and job.summary.world_size == 2
    assert job.extras["job_id"] == ip.user_ns["_nbtrain_job"].job_id
    assert "SLURM job: RUNNING" in out.out and "SLURM job: COMPLETED" in out.out
    assert f"recorded as run #{job.extras['run_id']}" in out.out
    assert RunStore(tmp_path / "runs.sqlite").load("job_b").summary.world_size == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, ip.user_ns["model"].parameters()))


@pytest.mark.slow
def test_a_job_that_fails_in_a_part_from_an_earlier_cell_says_so_beside_the_ranks_error(
        ip, capsys, slurm_cluster):  # noqa: F811
    ip.run_cell(DIGITS)
    result = ip.run_cell("%%nbtrain --slurm --num-nodes 1 --devices 1 --accelerator cpu --max-steps 2 "
                         "--batch-size 16 --sbatch cpus_per_task=1 --no-plot --no-progress\n"
                         "model = torch.nn.Sequential(torch.nn.Linear(64, 10))\n"
                         "train_data = torch.utils.data.TensorDataset(torch.randn(64, 64), torch.randn(64, 1))\n")
    text = capsys.readouterr().out
    assert type(result.error_in_exec).__name__ == "SlurmJobError", text
    assert "0D or 1D target tensor expected" in text, text
    assert text.startswith("loss_fn: CrossEntropyLoss() from an earlier cell\n"), text  # as a run's header
    assert "\nnbtrain: loss_fn: CrossEntropyLoss() from an earlier cell" in text, text  # and beside the error
