"""Thirteen simulated machines (simulated_machine.py) for the checklist walk, each with its
exhaustive grid: host-bound, data-bound, compute-bound, memory-limited and memory-bound, on a GPU and
on a CPU, and the interaction the H200 showed (ResNet-18, 16,384 CIFAR-sized samples: batch 32 bound
by the host, batch 2048 by the DataLoader, held data ~3x the DataLoader's best there)."""
import itertools

from nbtrain import TrainConfig
from nbtrain.walk.items import batch_candidates, precision_candidates, with_batch, with_workers, worker_candidates
from simulated_machine import Landscape, start_up_s, true_rate

GPU = TrainConfig(accelerator="cuda", batch_size=32)  # the naive start: fp32, batch 32, no workers, DataLoader
CPU = TrainConfig(accelerator="cpu", batch_size=16)
GRID_TRIAL_S = 2.0  # the CPU benchmark's trial per grid config (benchmarks/checklist_vs_grid.py)

LANDSCAPES = [
    # The H200 run: host-bound at 32, DataLoader-bound at 2048, held data the best.
    Landscape("h200-resnet18", GPU, receive_s=10e-6),
    # The same with a dataset the held-data rule does not hold (an augmentation): workers must feed it.
    Landscape("h200-resnet18-augmented", GPU, receive_s=6e-6, loader_s=60e-6, holdable=False),
    # A tiny MLP on the GPU: the host's fixed cost per step is everything.
    Landscape("gpu-host-bound-mlp", GPU, flops=2e6, conv_share=0.0, traffic=2e4, has_conv=False, model_ops=60,
              optimizer_ops=40, input_bytes=512, loader_s=4e-6),
    # Heavy per-sample decoding, 16 cores: workers and a batch they keep busy.
    Landscape("gpu-data-bound-decode", GPU, loader_s=400e-6, receive_s=3e-6, holdable=False),
    # A transformer block stack held in memory: float32 matmuls, TF32 and bf16 decide.
    Landscape("gpu-compute-bound-matmuls", GPU.replace(batch_size=128, preload_data=True), flops=4e10,
              conv_share=0.0, has_conv=False, traffic=2e7),
    # Activations of 200 MB a sample on 80 GB: batch 256 fits in float32, 512 only in bf16.
    Landscape("gpu-memory-limited", GPU.replace(batch_size=16, preload_data=True), flops=3e10, conv_share=0.5,
              activation_bytes=2e8, memory=80e9, samples=8192),
    # Element-wise heavy: bytes, not FLOPs; bf16 halves them.
    Landscape("gpu-memory-bound", GPU.replace(batch_size=256, preload_data=True), flops=2e8, traffic=3e8,
              bandwidth=3e12),
    # Four cores: three workers at most; held data only pays at a large batch.
    Landscape("gpu-few-cores", GPU, cores=4, loader_s=30e-6, receive_s=4e-6),
    # The digits demo's shape on a CPU: a small model, data held or loaded without workers.
    Landscape("cpu-host-bound-digits", CPU, cuda=False, cores=2, samples=1797, host_op_s=12e-6, model_ops=40,
              optimizer_ops=20, flops=2e5, conv_share=0.0, has_conv=False, peak_fp32=3e10, peak_bf16=8e9,
              traffic=1e4, bandwidth=1e10, loader_s=8e-6, receive_s=3e-6, worker_start_s=0.3),
    # The CPU benchmark's shape: four FFT rounds per sample, a tiny MLP; workers on 4 cores.
    Landscape("cpu-data-bound-fft", CPU, cuda=False, cores=4, samples=2048, host_op_s=12e-6, model_ops=40,
              optimizer_ops=20, flops=2e5, conv_share=0.0, has_conv=False, peak_fp32=3e10, peak_bf16=8e9,
              traffic=1e4, bandwidth=1e10, loader_s=300e-6, receive_s=5e-6, holdable=False, worker_start_s=0.3),
    # The CPU benchmark as this 2-core box runs it: workers' batches cost the main process ~2 ms each, so at
    # batch 16 two workers are no faster than none and at batch 256 they are 1.7x faster (measured: 6,960 vs
    # 6,834 and 13,083 vs 7,541 samples/s): a walk that judged workers once, at batch 16, kept 0.63 of the best.
    Landscape("cpu-data-bound-fft-2-cores", CPU, cuda=False, cores=3, samples=2048, host_op_s=12e-6, model_ops=40,
              optimizer_ops=20, flops=2e5, conv_share=0.0, has_conv=False, peak_fp32=3e10, peak_bf16=8e9,
              traffic=1e4, bandwidth=1e10, loader_s=140e-6, receive_s=5e-6, receive_batch_s=2.2e-3, holdable=False,
              worker_start_s=0.3),
    # A conv net on a CPU: compute-bound, bf16 slower there (no fast bf16 units).
    Landscape("cpu-compute-bound-conv", CPU, cuda=False, cores=2, samples=4096, flops=3e8, peak_fp32=5e10,
              peak_bf16=2e10, traffic=5e6, bandwidth=1e10, loader_s=20e-6, worker_start_s=0.3),
    # A CPU with 2 GB for activations of 40 MB a sample: batch 32 fits, 64 does not.
    Landscape("cpu-memory-limited", CPU.replace(batch_size=4), cuda=False, cores=2, samples=2048, host_op_s=12e-6,
              flops=2e7, peak_fp32=5e10, peak_bf16=2e10, traffic=2e6, bandwidth=1e10, activation_bytes=4e7,
              memory=2e9, loader_s=20e-6, worker_start_s=0.3),
]


def grid(land: Landscape) -> list:
    """Every config of batch x workers x held data x precision a grid would train (held data: no workers)."""
    start = land.start
    out = []
    for b, n, held, p in itertools.product(batch_candidates(start, land.samples), worker_candidates(start, land.cores),
                                           (False, True) if land.holdable else (False,), precision_candidates(start)):
        if held and n:
            continue
        config = with_workers(with_batch(start, b, start), n).replace(precision=p, preload_data=held)
        out.append(config)
    return out


def grid_best(land: Landscape) -> tuple:
    """(best config, its samples/s, seconds the grid takes: a trial of GRID_TRIAL_S per config and its start-up)."""
    configs = grid(land)
    best = max(configs, key=lambda c: true_rate(land, c))
    seconds = sum(GRID_TRIAL_S + 0.05 + start_up_s(land, c) for c in configs)
    return best, true_rate(land, best), seconds


def budget_s(land: Landscape) -> float:
    """The walk's budget as a user would give it: the notebook's default of 60 s on a GPU; 30 s on a CPU,
    whose grids are a few minutes (a third of the grid's time is the bar)."""
    return 60.0 if land.cuda else 30.0


def walk_against_grid(land: Landscape, seed: int) -> dict:
    """The walk on the simulated machine, judged by the true rates: its choice over the grid's best, its time
    over the grid's."""
    from nbtrain.walk.walker import run_walk
    from simulated_machine import SimulatedMachine
    machine = SimulatedMachine(land, seed=seed)
    walk = run_walk(machine, budget_s=budget_s(land), clock=machine.clock)
    best, best_rate, grid_s = grid_best(land)
    return {"walk": walk, "quality": true_rate(land, walk.best_config) / best_rate, "time": walk.elapsed_s / grid_s,
            "grid_best": best, "machine": machine}
