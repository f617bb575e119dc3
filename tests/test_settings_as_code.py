"""Settings as code: a run's config as the %%nbtrain line and the TrainConfig(...) that reproduce it."""
import pytest

from nbtrain import TrainConfig
from nbtrain.notebook.magic import build_parser

CONFIGS = [TrainConfig(), TrainConfig(batch_size=256, precision="bf16", shuffle=False, max_steps=10),
           TrainConfig(checkpoint_dir="/tmp/a b", checkpoint_every="90s", lr=0.003, scale_lr="sqrt", base_batch_size=64),
           TrainConfig(accumulate_grad_batches=4, max_epochs=3, warmup_steps=20, seed=7)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.as_code())
def test_the_python_expression_rebuilds_the_same_config(config):
    assert eval(config.as_code(), {"TrainConfig": TrainConfig}) == config


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.as_flags())
def test_the_magic_line_parses_back_to_the_same_config(config, shell):
    import shlex
    words = shlex.split(config.as_flags())
    assert words[0] == "%%nbtrain"
    args, unknown = build_parser().parse_known_args(words[1:])
    assert not unknown
    given = {k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__ and v is not None}
    assert TrainConfig().replace(**given) == config


def test_export_config_prints_the_last_runs_settings(ip, capsys):
    ip.run_cell("from nbtrain.demo import DigitsDataset, DigitsMLP\nimport torch")
    ip.run_cell("%%nbtrain --max-steps 2 --batch-size 48 --no-plot --no-progress --name exported\n"
                "model, train_data, loss_fn = DigitsMLP(), DigitsDataset(), torch.nn.CrossEntropyLoss()")
    capsys.readouterr()
    ip.run_line_magic("nbtrain_export_config", "")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "%%nbtrain --batch-size 48 --max-steps 2"
    assert out[1] == "config = nbtrain.TrainConfig(batch_size=48, max_steps=2)"
    ip.run_line_magic("nbtrain_export_config", "exported")  # by the stored name, too
    assert capsys.readouterr().out.splitlines()[0] == "%%nbtrain --batch-size 48 --max-steps 2"
