import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from nbtrain import Engine, Recipe, RecipeError, TrainConfig
from nbtrain.adapters import recipe_from_namespace
from nbtrain.recipe import as_optimizer_factory

from helpers import regression_data


def test_recipe_is_read_from_a_namespace_by_conventional_names():
    model = nn.Linear(8, 1)
    namespace = {"model": model, "train_dataset": regression_data(), "criterion": nn.MSELoss(),
                 "optimizer": lambda p: torch.optim.SGD(p, lr=0.1), "loss": torch.tensor(1.0)}
    recipe = recipe_from_namespace(namespace)
    assert recipe.model is model and isinstance(recipe.loss_fn, nn.MSELoss)


def test_a_namespace_without_model_or_data_names_what_is_missing():
    with pytest.raises(RecipeError, match="defines no model and no train_data"):
        recipe_from_namespace({"loss_fn": nn.MSELoss()})
    with pytest.raises(RecipeError, match="defines no train_data"):
        recipe_from_namespace({"model": nn.Linear(2, 1)})


@pytest.mark.parametrize("pieces, message", [
    ({"model": "not a model"}, "model: got str; allowed: a torch.nn.Module"),
    ({"train_data": [1, 2, 3][0]}, "train_data: got int; allowed: a map-style Dataset"),
    ({"train_data": TensorDataset(torch.zeros(0, 8), torch.zeros(0, 1))}, "train_data: the dataset is empty"),
    ({"loss_fn": 3}, "loss_fn: got int; allowed: a function"),
    ({"optimizer": "adam"}, "optimizer: got str"),
])
def test_wrong_pieces_are_named(pieces, message):
    values = {"model": nn.Linear(8, 1), "train_data": regression_data(), "loss_fn": nn.MSELoss()}
    values.update(pieces)
    with pytest.raises(RecipeError, match=message):
        Recipe(**values)


def test_an_optimizer_instance_becomes_a_factory_of_the_same_kind():
    model = nn.Linear(8, 1)
    factory = as_optimizer_factory(torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.5))
    rebuilt = factory(model.parameters())
    assert isinstance(rebuilt, torch.optim.SGD) and rebuilt.defaults["lr"] == 0.3


def test_batches_that_are_not_pairs_get_a_clear_message():
    class Triples(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.zeros(8), torch.zeros(1), 0

    recipe = Recipe(model=nn.Linear(8, 1), train_data=Triples(), loss_fn=nn.MSELoss())
    with pytest.raises(RecipeError, match="must be \\(input, target\\) pairs.*got a list of 3"):
        Engine(recipe, TrainConfig(batch_size=2, max_steps=1)).run()


def test_without_a_loss_a_model_that_returns_no_loss_is_named_at_the_first_step():
    recipe = Recipe(model=nn.Linear(8, 1), train_data=regression_data())
    with pytest.raises(RecipeError, match="neither loss_fn nor training_step is given and the model returned "
                                          "nothing yet: a batch of \\(inputs, targets\\) needs loss_fn"):
        Engine(recipe, TrainConfig(batch_size=8, max_steps=1)).run()
    features_only = Recipe(model=nn.Linear(8, 1), train_data=torch.randn(16, 8))  # batches are bare tensors
    with pytest.raises(RecipeError, match="the model returned a tensor of shape \\(8, 1\\)"):
        Engine(features_only, TrainConfig(batch_size=8, max_steps=1)).run()
