"""DDP ranks forked from the zygote can use CUDA: nothing before a fork initialises it.

A fork of a process that initialised CUDA cannot use the GPU ("CUDA error: initialization error",
what the first H200 run showed). These tests run on the CPU: the zygote starts with a
`sitecustomize` that answers as NVML does on a one-GPU machine (available, one device) and
records every call that would initialise CUDA (`torch.cuda._lazy_init`, `torch._C._cuda_init`,
the driver's device count), in the zygote and in each rank until its job starts; once the job
starts, the rank sees this CPU machine as it is. None may be recorded before the job.
"""
import json
import os
import sys

import cloudpickle
import pytest

import nbtrain
from nbtrain import TrainConfig, hardware
from nbtrain.demo import digits_recipe
from nbtrain.distributed import launch as launching
from nbtrain.distributed.launchers import local as local_launcher
from nbtrain.distributed.pool import Zygote

cloudpickle.register_pickle_by_value(sys.modules[__name__])

_SITECUSTOMIZE = '''
import json, os, traceback
import torch

_RECORD = os.environ.get("NBTRAIN_TEST_CUDA_RECORD")
_phase = ["zygote"]
_real = {"is_available": torch.cuda.is_available, "device_count": torch.cuda.device_count,
         "is_initialized": torch.cuda.is_initialized}


def _recorder(name, original):
    def record(*args, **kwargs):
        if _phase[0] != "job":
            with open(_RECORD, "a") as out:
                out.write(json.dumps({"what": name, "phase": _phase[0], "pid": os.getpid(),
                                      "stack": "".join(traceback.format_stack(limit=10))}) + "\\n")
        return original(*args, **kwargs)
    return record


if _RECORD:
    # What NVML answers on a machine with one GPU: no CUDA call is made to answer it.
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    if os.environ.get("NBTRAIN_TEST_CUDA_INITIALISED"):  # a zygote in which something initialised CUDA
        torch.cuda.is_initialized = lambda: True
    torch.cuda._lazy_init = _recorder("torch.cuda._lazy_init", torch.cuda._lazy_init)
    torch._C._cuda_init = _recorder("torch._C._cuda_init", torch._C._cuda_init)
    torch._C._cuda_getDeviceCount = _recorder("torch._C._cuda_getDeviceCount", torch._C._cuda_getDeviceCount)
    os.register_at_fork(after_in_child=lambda: _phase.__setitem__(0, "rank before its job"))

    from nbtrain.distributed import worker

    def _job_starts(run_job):
        def run(run_dir):
            _phase[0] = "job"  # from here on the rank runs on this machine as it is (a CPU)
            torch.cuda.is_available, torch.cuda.device_count = _real["is_available"], _real["device_count"]
            torch.cuda.is_initialized = _real["is_initialized"]
            return run_job(run_dir)
        return run

    worker.run_job = _job_starts(worker.run_job)
'''


@pytest.fixture
def recording_zygote(tmp_path, monkeypatch):
    """A zygote of its own (not the session's warm one) started with the recorder; its record's path."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    record = tmp_path / "cuda-calls.jsonl"
    record.touch()

    def start(initialised=False):
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
        monkeypatch.setenv("NBTRAIN_TEST_CUDA_RECORD", str(record))
        if initialised:
            monkeypatch.setenv("NBTRAIN_TEST_CUDA_INITIALISED", "1")
        zygote = Zygote()
        started.append(zygote)
        monkeypatch.setattr(local_launcher, "ZYGOTE", zygote)  # the zygote the local launcher forks from
        assert zygote.wait_ready(), "the recording zygote did not start:\n" + "".join(zygote._errors)
        # The ranks get the kernel's environment at launch: without the simulation (a fresh one is this CPU).
        monkeypatch.delenv("NBTRAIN_TEST_CUDA_INITIALISED", raising=False)
        monkeypatch.delenv("NBTRAIN_TEST_CUDA_RECORD")
        return zygote

    started: list = []
    yield start, record
    for zygote in started:
        zygote.close()


def _calls(record):
    return [json.loads(line) for line in record.read_text().splitlines()]


def _before_the_job(record):
    return [f"{c['phase']}: {c['what']}\n{c['stack']}" for c in _calls(record)]


def _parent_pid():
    return os.getppid()


def test_nothing_initialises_cuda_in_the_zygote_or_a_rank_before_its_job(recording_zygote):
    start, record = recording_zygote
    zygote = start()
    assert launching.launch(_parent_pid, nprocs=2, echo=False) == zygote.pids()[0]  # forked by the zygote
    assert _before_the_job(record) == []


def test_ddp_after_training_in_the_kernel_forks_ranks_that_never_initialised_cuda(recording_zygote):
    start, record = recording_zygote
    start()
    recipe = digits_recipe(seed=0)
    first = nbtrain.fit(recipe=recipe, config=TrainConfig(batch_size=16, max_steps=3, accelerator="cpu"))
    assert first.status == "completed"
    then = nbtrain.fit(recipe=recipe, config=TrainConfig(devices=2, batch_size=16, max_steps=3, accelerator="cpu"))
    assert then.status == "completed" and then.summary.world_size == 2
    assert _before_the_job(record) == []


@pytest.mark.slow
def test_a_zygote_with_cuda_initialised_starts_fresh_ranks_and_says_why(recording_zygote, capfd):
    start, _ = recording_zygote
    zygote = start(initialised=True)
    parent = launching.launch(_parent_pid, nprocs=2, echo=False)
    assert parent == os.getpid() and parent not in zygote.pids()  # fresh interpreters this process started
    err = capfd.readouterr().err
    assert err.count("starts as a fresh interpreter") == 2 and "CUDA was initialised in nbtrain's worker starter" in err


@pytest.mark.parametrize("cuda_build", [True, False], ids=["cuda-build", "cpu-build"])
def test_reading_the_inventory_initialises_no_cuda(monkeypatch, cuda_build):
    # Both builds of torch, whichever one this venv holds: a +cpu torch is not compiled with CUDA, and
    # there the inventory counts no device without asking (the README's CPU install gives that build).
    import torch
    calls = []
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: calls.append("_lazy_init"))
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: cuda_build)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_build)  # what NVML answers on a one-GPU machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1 if cuda_build else 0)
    hardware._probe.cache_clear()
    try:
        found = hardware._probe()
    finally:
        hardware._probe.cache_clear()
    # Without NVML's compute capability (none here) bf16 is not claimed; is_bf16_supported() was not asked.
    assert calls == [] and found.cuda_devices == (1 if cuda_build else 0) and found.cuda_bf16 is False


def test_the_zygote_reads_a_loaded_cuda_driver_as_unsafe_to_fork(tmp_path):
    from nbtrain.distributed import zygote
    clean, loaded = tmp_path / "clean", tmp_path / "loaded"
    clean.write_text("7f00-7f10 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n")  # NVML: not the driver
    loaded.write_text(clean.read_text() + "7f20-7f30 r-xp 0 08:01 2 /usr/lib/x86_64-linux-gnu/libcuda.so.580.1\n")
    assert not zygote.driver_loaded(str(clean)) and zygote.driver_loaded(str(loaded))
    assert not zygote.driver_loaded(str(tmp_path / "absent"))
    assert zygote.fork_unsafe() is None  # this process: no driver here, CUDA not initialised


@pytest.mark.cuda
def test_on_a_gpu_the_inventory_reads_devices_and_bf16_from_nvml_without_initialising_cuda():
    import subprocess
    probe = ("import json, torch\nfrom nbtrain import hardware\ninv = hardware._probe()\n"
             "print(json.dumps([torch.cuda.is_initialized(), inv.cuda_devices, inv.cuda_bf16, hardware.capability(0)]))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)  # as a user's kernel runs
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    initialised, devices, bf16, read = json.loads(out.stdout.strip().splitlines()[-1])
    import torch
    assert not initialised and devices == torch.cuda.device_count()  # this process may initialise: it is a test
    assert tuple(read) == torch.cuda.get_device_capability(0) and bf16 == (tuple(read) >= (8, 0))
