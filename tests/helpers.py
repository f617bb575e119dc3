"""Small recipes the tests train (real models, real data, real loaders)."""
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from nbtrain import Recipe


def regression_data(n=256, features=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(n, 1, generator=g))


def edge_of_stability_recipe():
    """Linear regression on wide inputs with SGD at lr 0.02, near its largest stable rate: a rate
    scaled up 16x or more makes the loss diverge."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g) * 3
    data = TensorDataset(x, x @ torch.randn(16, 1, generator=g))
    torch.manual_seed(0)
    return Recipe(model=nn.Sequential(nn.Linear(16, 1)), train_data=data, loss_fn=nn.MSELoss(),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.02))


def unstable_at_four_times_its_rate_recipe():
    """One weight w on the loss w**2 (every sample x=1, y=0), w from 1000, SGD at lr 0.45: each step multiplies
    w by 1 - 2 lr, so w shrinks at this rate (x 0.1) and at twice it (x -0.8), and grows x -2.6 at 4x it (the
    linear rule's rate for 4x the batch): the loss overflows at step 39, whatever the batch order or the
    machine's speed."""
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1000.0)
    data = TensorDataset(torch.ones(512, 1), torch.zeros(512, 1))
    return Recipe(model=model, train_data=data, loss_fn=nn.MSELoss(),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.45))


def regression_recipe(seed=0, optimizer=None, **data):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return Recipe(model=model, train_data=regression_data(**data), loss_fn=nn.MSELoss(),
                  optimizer=optimizer or (lambda p: torch.optim.SGD(p, lr=0.05)))


class IndexedData(Dataset):
    """Items are (features, index), so a training step can record which samples it saw."""

    def __init__(self, n=100):
        self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def same_weights(a, b, atol=0.0):
    return all(torch.allclose(x, y, atol=atol, rtol=0) if atol else torch.equal(x, y) for x, y in zip(a, b))


def weights_differ(a, b) -> str | None:
    """Where two models' weights are not bit-identical ('0.weight differs by 0.0031'), or None."""
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        if not torch.equal(x, y):
            return f"{name} differs by {(x - y).abs().max().item():.3g}"
    return None


def fit_on_two_local_nodes(recipes, **options):
    """Two 'nodes' of one process each, meeting at a c10d rendezvous on 127.0.0.1, as two kernels would.

    Each node is nbtrain.fit with num_nodes=2 and its node_rank, in a thread of its own; returns both
    results, or fails with what every node raised.
    """
    import socket
    import threading

    import nbtrain
    from nbtrain import TrainConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"
    results, errors = [None, None], []

    def node(rank):
        try:  # the launch options are config options, as a magic's flags or the demo's command line give them
            config = TrainConfig(num_nodes=2, node_rank=rank, rdzv_endpoint=endpoint, timeout=60, **options)
            results[rank] = nbtrain.fit(recipe=recipes[rank], config=config)
        except Exception as exc:  # reported below, with the other node's outcome
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    return results


def kernel_helpers() -> set:
    """The kernel's own long-lived child processes, not ones a run left behind: the warm worker starter (the
    zygote) and the live plot's drawing process, each started once and living as long as the kernel, by design."""
    from nbtrain.distributed.pool import ZYGOTE
    from nbtrain.notebook.views import FRAMES
    return set(ZYGOTE.pids()) | ({FRAMES.pid} - {None})
