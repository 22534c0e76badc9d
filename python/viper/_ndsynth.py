"""A small synthetic image-like data set and model for viper.neardata's tests, bench and demo.

Samples are float32 images [3, 16, 16] (3072 bytes a record): one of `classes` smooth random
prototypes, randomly shifted, plus noise. The model ("viper._ndsynth:build") is a small CNN
whose `backbone` (two convolutions, a linear layer and a layer norm: 32 features) stands for pretrained frozen
layers and whose `head` (a linear layer) is fine-tuned. Everything is seeded: the same call gives
the same bytes and the same initial weights in every process.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from . import data as _data

SHAPE = (3, 16, 16)
CLASSES = 10
FEATURES = 32


def _prototypes(classes: int) -> np.ndarray:
    g = torch.Generator().manual_seed(20261127)
    coarse = torch.rand((classes,) + (SHAPE[0], 4, 4), generator=g)
    return torch.nn.functional.interpolate(coarse, size=SHAPE[1:], mode="bilinear", align_corners=False).numpy()


def samples(n: int, seed: int, classes: int = CLASSES, noise: float = 0.35):
    """(x float32 [n, 3, 16, 16], y int64 [n]), deterministic in (n, seed)."""
    rng = np.random.default_rng(seed)
    protos = _prototypes(classes)
    y = rng.integers(0, classes, size=n)
    x = protos[y]
    shifts = rng.integers(-2, 3, size=(n, 2))
    x = np.stack([np.roll(img, (int(a), int(b)), axis=(1, 2)) for img, (a, b) in zip(x, shifts)])
    x = x + noise * rng.standard_normal(x.shape)
    return x.astype(np.float32), y.astype(np.int64)


def write_shard(path, n: int, seed: int, first_id: int = 0) -> int:
    """A record file of n samples (labels = their classes); returns the file's size in bytes."""
    x, y = samples(n, seed)
    _data.write_records(path, ((xi.reshape(-1).view(np.uint8), int(yi)) for xi, yi in zip(x, y)))
    return os.path.getsize(path)


class Net(torch.nn.Module):
    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.backbone = torch.nn.Sequential(
            torch.nn.Unflatten(1, SHAPE),
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(), torch.nn.Linear(512, FEATURES), torch.nn.LayerNorm(FEATURES))
        self.head = torch.nn.Linear(FEATURES, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


def build() -> Net:
    """The model, with the same initial weights in every process (seeded)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(27)
    try:
        return Net()
    finally:
        torch.random.set_rng_state(state)


def perturb(module, seed: int, scale: float = 0.05) -> None:
    """A new version for relabelling tests: the head's weights moved a little (seeded)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.head.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def slow_transform(batch: np.ndarray) -> torch.Tensor:
    """The default float32 view, after sleeping VIPER_NDSYNTH_SLEEP seconds (default 0.01): tests
    use it to make a pass long enough to interrupt."""
    import time
    time.sleep(float(os.environ.get("VIPER_NDSYNTH_SLEEP", "0.01")))
    return torch.from_numpy(batch).view(torch.float32)
