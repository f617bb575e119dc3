"""Settings as code: a run's config as the %%nbtrain line and the TrainConfig(...) that reproduce it.

Both state every option that differs from its default and every option given on purpose at its default
(`TrainConfig.given`): an explicit batch_size=32 over a DataLoader's 64 trains at 32, so the line printed
for that run must say --batch-size 32, and what it rebuilds must have the same options given."""
import random
import shlex

import pytest

from nbtrain import TrainConfig
from nbtrain.config import option_names, options
from nbtrain.options import ConfigError
from nbtrain.flags import config_from_flags
from nbtrain.notebook import arguments
from nbtrain.notebook.magic import build_parser

# A value other than the default for every option, read back from text as from Python; paths with spaces,
# quotes and a leading '-', None where the default is a value (seed), canonical and alias spellings.
CHANGED = dict(
    accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", launcher="torchrun", node_rank=1, rdzv_endpoint="[::1]:29400",
    rdzv_host="10.0.0.1", find_unused_parameters=True, timeout=30, precision="bf16", batch_size=256,
    accumulate_grad_batches=4, max_epochs=3, max_steps=10, max_time=7.5, num_workers=2, pin_memory=False,
    persistent_workers=True, prefetch_factor=4, shuffle=False, drop_last=True, preload_data=True, lr=3e-4,
    scale_lr="sqrt", base_batch_size=64, warmup_steps=20, schedule_counts="samples", gradient_clip_val=1.5, seed=None, compile="true",
    channels_last=True, matmul_precision="high", cudnn_benchmark=False, optimizer_impl="foreach",
    activation_checkpointing="layers.0,head", checkpoint_every="90s", checkpoint_dir="/tmp/a b",
    resume="-it's last.pt", on_nonfinite_loss="continue", val_every_n_steps=50, monitor="val_acc", mode="max",
    patience=3, restore_best=True, logger="csv", logger_dir="logs \"dir\"", log_every_n_steps=1, num_threads=1)
DEFAULTS = TrainConfig().to_dict()


def generated_configs(count: int, seed: int = 0) -> list[TrainConfig]:
    """`count` valid configs: each option not given, given at its default, or given changed (by keyword,
    from a dict, or by a later `replace`), chosen at random; combinations the config refuses are skipped."""
    rng, out = random.Random(seed), []
    while len(out) < count:
        first, later = {}, {}
        for name in option_names():
            how = rng.choice(("not given", "default", "changed"))
            if how != "not given":
                (later if rng.random() < 0.25 else first)[name] = DEFAULTS[name] if how == "default" else CHANGED[name]
        try:
            config = rng.choice((lambda v: TrainConfig(**v), TrainConfig.from_dict))(first)
            out.append(config.replace(**later) if later else config)
        except ConfigError:
            continue
    return out


CONFIGS = [TrainConfig(), TrainConfig(batch_size=256, precision="bf16", shuffle=False, max_steps=10),
           TrainConfig(checkpoint_dir="/tmp/a b", checkpoint_every="90s", lr=0.003, scale_lr="sqrt", base_batch_size=64),
           TrainConfig(accumulate_grad_batches=4, max_epochs=3, warmup_steps=20, seed=7),
           TrainConfig(batch_size=32, shuffle=True, seed=0, checkpoint_dir=None, monitor=None, pin_memory=None),
           TrainConfig(max_steps=5).replace(num_workers=0, precision="32")]
WRITTEN = len(CONFIGS)
CONFIGS += generated_configs(40)
IDS = [config.as_code() if i < WRITTEN else f"generated{i - WRITTEN}" for i, config in enumerate(CONFIGS)]


def test_every_option_has_a_changed_value_to_generate():
    assert set(CHANGED) == set(option_names())
    assert [name for name, (option, default) in options().items() if option.read(CHANGED[name]) == default] == []
    stated = [name for config in CONFIGS for name in config.given]
    at_default = [name for config in CONFIGS for name in config.given if getattr(config, name) == DEFAULTS[name]]
    assert set(stated) == set(at_default) == set(option_names())  # each option generated both ways
    assert any("--resume=" in config.as_flags() for config in CONFIGS)  # a value read as a flag without "="


def test_an_option_given_at_its_default_is_stated():
    config = TrainConfig(batch_size=32, max_steps=2, shuffle=True, checkpoint_dir=None, seed=0)
    assert config.as_flags() == "%%nbtrain --batch-size 32 --max-steps 2 --shuffle true --seed 0 --checkpoint-dir ''"
    assert config.as_code() == "TrainConfig(batch_size=32, max_steps=2, shuffle=True, seed=0, checkpoint_dir=None)"
    assert TrainConfig().replace(num_workers=0).as_flags() == "%%nbtrain --num-workers 0"
    assert TrainConfig().as_flags() == "%%nbtrain" and TrainConfig().as_code() == "TrainConfig()"


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_the_python_expression_rebuilds_the_same_config(config):
    rebuilt = eval(config.as_code(), {"TrainConfig": TrainConfig})
    assert rebuilt == config
    assert rebuilt.given == config.given


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_the_magic_line_parses_back_to_the_same_config(config):
    line = config.as_flags()
    assert line.split()[0] == "%%nbtrain"
    args, unknown = build_parser().parse_known_args(arguments.split("%%nbtrain", line.partition(" ")[2]))
    assert not unknown
    rebuilt = config_from_flags(args)
    assert rebuilt == config
    assert rebuilt.given == config.given


def test_the_options_keep_their_declared_order():
    config = TrainConfig(log_every_n_steps=10, seed=3, batch_size=32, accelerator="cpu")
    assert [word for word in shlex.split(config.as_flags()) if word.startswith("--")] == \
        ["--accelerator", "--batch-size", "--seed", "--log-every-n-steps"]
    assert config.as_code() == "TrainConfig(accelerator='cpu', batch_size=32, seed=3, log_every_n_steps=10)"


def test_export_config_prints_the_last_runs_settings(ip, capsys):
    ip.run_cell("from nbtrain.demo import DigitsDataset, DigitsMLP\nimport torch")
    ip.run_cell("%%nbtrain --max-steps 2 --batch-size 48 --num-workers 0 --no-plot --no-progress --name exported\n"
                "model, train_data, loss_fn = DigitsMLP(), DigitsDataset(), torch.nn.CrossEntropyLoss()")
    capsys.readouterr()
    ip.run_line_magic("nbtrain_export_config", "")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "%%nbtrain --batch-size 48 --max-steps 2 --num-workers 0"  # 0 workers given: stated
    assert out[1] == "config = nbtrain.TrainConfig(batch_size=48, max_steps=2, num_workers=0)"
    ip.run_line_magic("nbtrain_export_config", "exported")  # by the stored name, too: the store keeps `given`
    assert capsys.readouterr().out.splitlines()[0] == "%%nbtrain --batch-size 48 --max-steps 2 --num-workers 0"
