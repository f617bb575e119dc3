"""The launcher's options (collective timeout, node rank, rendezvous endpoint and host) are TrainConfig options."""
import sys

import cloudpickle
import pytest

import nbtrain
from nbtrain import ConfigError, TrainConfig
from nbtrain.__main__ import main as command_line
from nbtrain.demo import digits_recipe
from nbtrain.distributed.launchers.base import WorkerError

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.parametrize("values, message", [
    ({"rdzv_endpoint": "10.0.0.1"}, "rdzv_endpoint='10.0.0.1': 'host:port' with a port from 1 to 65535"),
    ({"rdzv_endpoint": "10.0.0.1:0"}, "rdzv_endpoint='10.0.0.1:0': 'host:port' with a port from 1 to 65535"),
    ({"rdzv_endpoint": "10.0.0.1:70000"}, "rdzv_endpoint='10.0.0.1:70000': 'host:port' with a port from 1 to 65535"),
    ({"rdzv_endpoint": "::1:29400"}, "rdzv_endpoint='::1:29400': 'host:port' with a port from 1 to 65535 "
                                     "(e.g. 10.0.0.1:29400, [::1]:29400)"),
    ({"rdzv_endpoint": "bad host:29400"}, "rdzv_endpoint='bad host:29400': 'host:port'"),
    ({"rdzv_host": "a;b"}, "rdzv_host='a;b': a host name or IP address of this machine, or None (127.0.0.1)"),
    ({"node_rank": -1}, "node_rank=-1: a whole number >= 0, or None ($NBTRAIN_NODE_RANK)"),
    ({"node_rank": 2, "num_nodes": 2}, "node_rank=2: a whole number from 0 to 1 (this machine's place among "
                                       "num_nodes=2)"),
    ({"node_rank": 1}, "node_rank=1: a whole number from 0 to 0"),
    ({"timeout": 0}, "timeout=0: a number of seconds > 0, or None (1800, torch's default)"),
    ({"timeout": "soon"}, "timeout='soon': a number of seconds > 0"),
])
def test_bad_launch_options_name_the_option_the_value_and_what_is_allowed(values, message):
    with pytest.raises(ConfigError) as caught:
        TrainConfig(accelerator="cpu", **values)
    assert message in str(caught.value)


def test_good_launch_options_are_read_and_normalised():
    config = TrainConfig(num_nodes=2, node_rank="1", rdzv_endpoint=" node-7.lan:29400 ", rdzv_host="10.0.0.2",
                         timeout="90", accelerator="cpu")
    assert (config.node_rank, config.rdzv_endpoint, config.rdzv_host, config.timeout) == \
        (1, "node-7.lan:29400", "10.0.0.2", 90.0)
    assert TrainConfig(rdzv_endpoint="[::1]:29400", rdzv_host="[::1]").rdzv_host == "::1"
    assert TrainConfig().rdzv_host is None  # the ranks of one machine meet on 127.0.0.1


def test_the_demo_command_line_has_the_launch_options_as_flags(capsys):
    assert command_line(["demo", "--rdzv-endpoint", "nohost", "--quiet"]) == 2
    assert "--rdzv-endpoint=nohost: 'host:port' with a port from 1 to 65535" in capsys.readouterr().err
    assert command_line(["demo", "--timeout", "-5", "--quiet"]) == 2
    assert "--timeout=-5: a number of seconds > 0" in capsys.readouterr().err


def _rank_one_stalls(model, batch):
    import time
    import torch.distributed as dist
    import torch.nn.functional as F
    if dist.get_rank() == 1:
        time.sleep(60)  # rank 0 waits in the gradient all-reduce until the configured timeout
    x, y = batch
    return F.cross_entropy(model(x), y)


@pytest.mark.slow
def test_the_configured_collective_timeout_ends_a_stalled_run():
    recipe = digits_recipe()
    recipe.training_step = _rank_one_stalls
    with pytest.raises(WorkerError, match=r"rank 0 timed out after 3 s waiting in a collective operation"):
        nbtrain.fit(recipe=recipe, config=TrainConfig(devices=2, accelerator="cpu", max_steps=2, batch_size=16,
                                                      timeout=3))
