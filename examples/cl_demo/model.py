"""An NT3-like 1-D CNN whose size is set by one number: the megabytes of its wide dense layer.

CANDLE's NT3 classifies 60k-wide expression profiles with a few Conv1d layers, a flatten and a
Dense(200) on the flattened activations; that dense weight dominates the bytes. This model keeps
that shape: two small Conv1d layers, then Linear(channels * input_len -> 200), then two small dense
layers. `dense_mb` picks input_len so that the wide weight is about that many MiB in fp32, which
makes the transfer cost of a version easy to dial while a training step stays cheap (the convs are
small; the wide layer costs one pass over its bytes per matrix product).

The wide layer's input is normalised per sample (divided by its root mean square, no learned
parameters) and the layer uses the NTK scaling (weights ~ N(0, 1), input multiplied by
1/sqrt(fan_in)), so one plain-SGD learning rate works at every size: a step's effect on the output
neither shrinks nor grows as the layer widens, and the wide layer learns as fast as the small ones.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.nn.utils import skip_init


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    dense_mb: float = 300.0   # MiB of the wide dense weight (fp32); the model is a bit larger
    conv1_channels: int = 4
    conv2_channels: int = 16
    hidden: int = 200         # width of the wide dense layer's output (NT3: Dense(200))
    classes: int = 2

    def __post_init__(self):
        if not self.dense_mb > 0:
            raise ValueError(f"ModelConfig: dense_mb must be > 0, got {self.dense_mb}")
        for name in ("conv1_channels", "conv2_channels", "hidden", "classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig: {name} must be >= 1, got {getattr(self, name)}")

    @property
    def input_len(self) -> int:
        """Signal width that gives the wide weight dense_mb MiB (at least 8)."""
        weights = self.dense_mb * 2**20 / 4
        return max(8, round(weights / (self.hidden * self.conv2_channels)))

    @property
    def flat_width(self) -> int:
        return self.conv2_channels * self.input_len


class NT3Like(nn.Module):
    """conv(1->c1, k7) relu conv(c1->c2, k5) relu flatten dense(->hidden) relu dense(->20) relu dense(->classes)."""

    def __init__(self, config: ModelConfig, seed: int = 0, init_weights: bool = True):
        """init_weights=False leaves the wide weight uninitialised (about a second saved at
        hundreds of MB) for a caller that loads a state_dict right away."""
        super().__init__()
        self.config = config
        torch.manual_seed(seed)
        self.conv1 = nn.Conv1d(1, config.conv1_channels, kernel_size=7, padding=3)
        self.conv2 = nn.Conv1d(config.conv1_channels, config.conv2_channels, kernel_size=5, padding=2)
        self.dense = skip_init(nn.Linear, config.flat_width, config.hidden)
        self.fc2 = nn.Linear(config.hidden, 20)
        self.out = nn.Linear(20, config.classes)
        if init_weights:
            with torch.no_grad():
                self.dense.weight.normal_(0.0, 1.0)  # NTK scaling: see the module docstring
                self.dense.bias.zero_()
        self.flat_scale = 1.0 / math.sqrt(config.flat_width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(x))
        h = torch.relu(self.conv2(h))
        h = torch.flatten(h, 1)
        h = h * (self.flat_scale * torch.rsqrt(h.pow(2).mean(1, keepdim=True) + 1e-6))  # RMS norm + NTK scale
        h = torch.relu(self.dense(h))
        h = torch.relu(self.fc2(h))
        return self.out(h)


def state_bytes(module: nn.Module) -> int:
    """Bytes of the module's state_dict tensors (what a transport moves per version)."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Plain SGD: no per-parameter state, so a step touches each weight once (momentum or Adam would
    add one or two model-sized buffers and their memory traffic)."""
    return torch.optim.SGD(model.parameters(), lr=lr)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """One SGD step on (x, y); returns the batch's cross-entropy before the step."""
    # set_to_none: backward then writes each gradient once instead of computing it and adding it
    # into a zeroed buffer (a second pass over the wide layer's bytes). See tune_malloc() for why
    # the fresh gradient tensor does not cost page faults.
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return float(loss)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """(mean cross-entropy, accuracy) of the model on (x, y)."""
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    acc = (logits.argmax(1) == y).float().mean()
    return float(loss), float(acc)
