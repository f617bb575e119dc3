"""Every speed toggle of engine/toggles.py with the value to try and a small recipe on which it must train
(test_toggles.py trains each one), and the recipes themselves: an MLP and a small CNN on the digits, and a
torchvision ResNet-18 on FakeData images through torchvision transforms (an image notebook's shape).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from nbtrain.demo import DigitsDataset, digits_recipe
from nbtrain.doctor import import_torchvision
from nbtrain.recipe import Recipe


@dataclass(frozen=True)
class Toggle:
    option: str
    value: object
    recipe: Callable  # () -> Recipe on which the toggle must train
    needs: str = ""  # "cuda" when the toggle only acts on a GPU
    with_options: tuple = ()  # other options the toggle needs, as (name, value) pairs


def mlp_recipe():
    """The digits MLP (nbtrain.demo), for the toggles that act on any model."""
    return digits_recipe()


def conv_recipe():
    """A small CNN on the digits as 8x8 images: 2-D convolutions for channels_last."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(8 * 64, 10))
    return Recipe(model=model, train_data=DigitsDataset(image=True), loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))


def image_recipe(images: int = 128, size: int = 32, seed: int = 0):
    """A torchvision ResNet-18 on FakeData images through torchvision transforms: the shape of a real
    image notebook (PIL decode, augmentation and normalisation per sample in the loader; batch
    norm; convolutions that channels_last and cuDNN act on), small enough for a laptop CPU."""
    import_torchvision()  # a torch and torchvision not built for each other: one line saying what to run
    from torchvision import datasets, models
    from torchvision.transforms import v2

    transform = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
                            v2.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])
    torch.manual_seed(seed)
    return Recipe(model=models.resnet18(num_classes=10),
                  train_data=datasets.FakeData(images, (3, size, size), 10, transform=transform),
                  val_data=datasets.FakeData(images // 4, (3, size, size), 10, transform=transform,
                                             random_offset=images),  # other images than the training ones
                  loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))


TOGGLES = (
    Toggle("compile", "default", mlp_recipe),
    Toggle("channels_last", True, image_recipe),
    Toggle("matmul_precision", "high", mlp_recipe, needs="cuda"),
    Toggle("cudnn_benchmark", True, image_recipe, needs="cuda"),
    Toggle("optimizer_impl", "foreach", mlp_recipe),
    Toggle("optimizer_impl", "fused", mlp_recipe),
    Toggle("activation_checkpointing", "auto", mlp_recipe),
    # Loader toggles on per-sample PIL transforms, the work worker processes exist for.
    Toggle("persistent_workers", True, image_recipe, with_options=(("num_workers", 1),)),
    Toggle("prefetch_factor", 4, image_recipe, with_options=(("num_workers", 1),)),
)
