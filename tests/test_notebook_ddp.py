"""The notebook case, in a real Jupyter kernel: classes from earlier cells train as DDP, weights come back."""
import nbformat
import pytest
from nbclient import NotebookClient

CELLS = [
    """
import torch, nbtrain
from torch import nn
from nbtrain.demo import DigitsDataset
""",
    """
class Net(nn.Module):  # defined in the notebook: workers get it by value
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x):
        return self.body(x)
""",
    """
torch.manual_seed(0)
model = Net()
before = [p.detach().clone() for p in model.parameters()]
result = nbtrain.fit(model, DigitsDataset(), loss_fn=nn.CrossEntropyLoss(), devices=2, accelerator="cpu",
                     max_steps=6, batch_size=16, shuffle=False)
print("status", result.status, "world", result.summary.world_size, "steps", len(result.history["step"]))
""",
    """
torch.manual_seed(0)
reference = Net()
nbtrain.fit(reference, DigitsDataset(), loss_fn=nn.CrossEntropyLoss(), accelerator="cpu", max_steps=6,
            batch_size=32, shuffle=False)
same = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(model.parameters(), reference.parameters()))
changed = not all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
print("weights back", same, "changed", changed)
""",
    """
def training_step(model, batch):
    import torch.distributed as dist
    if dist.get_rank() == 1:
        raise RuntimeError("bad batch on rank 1")
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)

nbtrain.fit(model, DigitsDataset(), training_step=training_step, devices=2, accelerator="cpu", max_steps=2)
""",
    """
def hello(word):
    import torch.distributed as dist
    print(word, "from", dist.get_rank(), flush=True)
    return dist.get_world_size()

print("launch returned", nbtrain.launch(hello, nprocs=2, args=("hi",)))
""",
    """
%load_ext nbtrain
del training_step  # the magic reads the recipe from the namespace: leave the failing step behind
""",
    """
%%nbtrain --devices 2 --accelerator cpu --max-steps 4 --batch-size 16 --name ddp_magic --no-plot --no-progress
model = Net()
train_data = DigitsDataset()
loss_fn = nn.CrossEntropyLoss()
""",
    """
print("magic", ddp_magic.status, ddp_magic.summary.world_size, ddp_magic.summary.global_batch)
""",
]


def _text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_notebook_defined_model_trains_with_two_devices_and_its_weights_come_back(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src.strip()) for src in CELLS])
    NotebookClient(nb, kernel_name="python3", timeout=180, allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()  # the run store lands there
    cells = nb.cells
    for index in (0, 1, 2, 3, 5, 6, 7, 8):
        assert not [o for o in cells[index].outputs if o.output_type == "error"], cells[index].outputs
    assert "status completed world 2 steps 6" in _text(cells[2])
    assert "weights back True changed True" in _text(cells[3])
    # A rank raising: one error carrying that rank's traceback with the cell's own source line.
    errors = [o for o in cells[4].outputs if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "WorkerError"
    assert errors[0].evalue.startswith("rank 1 raised RuntimeError: bad batch on rank 1")
    assert 'raise RuntimeError("bad batch on rank 1")' in errors[0].evalue
    # The kernel stays usable, the next launch works, every rank's output arrives prefixed.
    out = _text(cells[5])
    assert "[rank 0] hi from 0" in out and "[rank 1] hi from 1" in out and "launch returned 2" in out
    # The cell magic with --devices 2 runs the same launcher.
    assert "magic completed 2 32" in _text(cells[8])
