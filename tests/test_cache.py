import os
import stat

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from nbtrain.tools.cache import CachedDataset, cache
from nbtrain.tools.tool_options import ToolOptionError

from checklist_recipes import HeavyTransformData


class CountingData(HeavyTransformData):
    """Counts how often the per-sample work runs in this process."""

    calls = 0

    def __getitem__(self, i):
        type(self).calls += 1
        return super().__getitem__(i)


class ScaledData(HeavyTransformData):
    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return 2 * x, y


class AugmentedData(HeavyTransformData):
    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return x + torch.rand(()), y


def test_cache_serves_the_same_samples_and_reopens_without_recomputing(tmp_path):
    data = CountingData(n=64)
    cached = cache(data, tmp_path, num_workers=0)
    for i in (0, 17, 63):
        x, y = cached[i]
        x0, y0 = data[i]
        assert torch.equal(x, x0) and int(y) == y0
    assert torch.equal(cached[-1][0], cached[63][0]) and len(cached) == 64
    CountingData.calls = 0
    again = cache(CountingData(n=64), tmp_path, num_workers=0)
    assert again.folder == cached.folder
    assert CountingData.calls <= 16  # only the fingerprint's probes ran, not the 64 samples


def test_a_changed_transform_or_parameter_is_never_served_stale(tmp_path):
    base = cache(HeavyTransformData(n=32), tmp_path, num_workers=0)
    other_rounds = cache(HeavyTransformData(n=32, rounds=5), tmp_path, num_workers=0)
    other_code = cache(ScaledData(n=32), tmp_path, num_workers=0)
    assert len({base.folder, other_rounds.folder, other_code.folder}) == 3
    assert torch.equal(other_code[3][0], 2 * base[3][0])
    assert not torch.equal(other_rounds[3][0], base[3][0])


def test_cache_fills_in_parallel_workers_and_trains_through_a_loader_with_workers(tmp_path):
    cached = cache(HeavyTransformData(n=96), tmp_path, num_workers=2, batch_size=16)
    loader = DataLoader(cached, batch_size=32, num_workers=2)
    xs = torch.cat([x for x, _ in loader])
    reference = torch.stack([HeavyTransformData(n=96)[i][0] for i in range(96)])
    assert torch.equal(xs, reference)


def test_random_augmentation_is_refused_with_the_way_out(tmp_path):
    with pytest.raises(ValueError) as error:
        cache(AugmentedData(n=16), tmp_path, num_workers=0)
    assert "differs between two reads" in str(error.value)
    assert "CachedDataset transform=" in str(error.value)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_augmentation_applies_after_reading_the_cache(tmp_path):
    folder = cache(HeavyTransformData(n=16), tmp_path, num_workers=0).folder
    flipped = CachedDataset(folder, transform=lambda s: (s[0].flip(0), s[1]))
    assert torch.equal(flipped[2][0], HeavyTransformData(n=16)[2][0].flip(0))


def test_cache_files_are_private_numpy_memmaps(tmp_path):
    cached = cache(HeavyTransformData(n=16), tmp_path / "c", num_workers=0)
    assert stat.S_IMODE(os.stat(tmp_path / "c").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cached.folder).st_mode) == 0o700
    assert isinstance(np.load(cached.folder / "field0.npy", mmap_mode="r"), np.memmap)


def test_bad_input_names_the_problem(tmp_path):
    with pytest.raises(ToolOptionError, match=r"num_workers=-2: allowed: a whole number >= 0, or None"):
        cache(HeavyTransformData(n=4), tmp_path, num_workers=-2)
    with pytest.raises(ValueError, match=r"dataset: got list; allowed: a non-empty map-style Dataset"):
        cache([], tmp_path)

    class Ragged(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.zeros(i + 1), 0

    with pytest.raises(ValueError, match=r"every sample must have the same shape and dtype"):
        cache(Ragged(), tmp_path, num_workers=0, batch_size=1)
