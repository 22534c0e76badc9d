"""A labelled data stream whose decision boundary rotates with wall-clock time.

Each sample is a 1-D signal (like one NT3 expression profile): a mix of `latent_dim` fixed smooth
patterns weighted by a latent vector z ~ N(0, I), plus white noise. With 2 classes its label is
whether z lies on the positive side of a boundary whose normal u(t) turns in the (z0, z1) plane at
a constant angular speed: u(t) = (cos(w t), sin(w t), 0, ...), w = 2*pi / period_s. With K > 2
classes the label is which of K equal sectors of the (z0, z1) plane, turned by the same angle, z
falls in (a harder task that is learned over hundreds of steps). period_s = inf: no drift. The drift clock t is the number of
seconds since a start time that the producer and the consumer share, so both agree on what the
"current" distribution is. A model trained at time t0 is wrong on a growing wedge of inputs: its
error rate is |angle(t) - angle(t0)| / pi, so a stale model gets worse at a known rate.

Everything is generated from seeds: no download, and the same seed gives the same samples in every
run, so two transports are compared on identical requests.
"""
from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    input_len: int               # samples per signal (the model's input width)
    latent_dim: int = 4          # z's dimension; only z0 and z1 decide the label
    period_s: float = 60.0       # seconds for one full turn of the boundary (inf: no drift)
    noise: float = 0.5           # std of the white noise added to each signal value
    seed: int = 1234             # fixes the patterns (shared by every process of a demo)
    classes: int = 2             # 2: half-plane rule; K > 2: K angular sectors

    def __post_init__(self):
        if self.input_len < 8:
            raise ValueError(f"StreamConfig: input_len must be >= 8, got {self.input_len}")
        if self.latent_dim < 2:
            raise ValueError(f"StreamConfig: latent_dim must be >= 2, got {self.latent_dim}")
        if not self.period_s > 0:
            raise ValueError(f"StreamConfig: period_s must be > 0, got {self.period_s}")
        if self.noise < 0:
            raise ValueError(f"StreamConfig: noise must be >= 0, got {self.noise}")
        if self.classes < 2:
            raise ValueError(f"StreamConfig: classes must be >= 2, got {self.classes}")


class DriftingStream:
    """Makes batches of (signal, label) for a given drift time.

    Thread-safety: sample() is safe from any thread (it only reads the patterns); a torch.Generator
    passed to it must not be shared between threads.
    """

    def __init__(self, config: StreamConfig):
        self.config = config
        self.patterns = _smooth_patterns(config.input_len, config.latent_dim, config.seed)

    def angle(self, t_s: float) -> float:
        """Angle in radians of the boundary normal at drift time t_s."""
        return 0.0 if math.isinf(self.config.period_s) else 2.0 * math.pi * t_s / self.config.period_s

    def sample(self, batch: int, t_s: float, generator: torch.Generator):
        """Returns (x [batch, 1, input_len] float32, y [batch] int64) drawn at drift time t_s."""
        if batch < 1:
            raise ValueError(f"DriftingStream.sample: batch must be >= 1, got {batch}")
        z = torch.randn(batch, self.config.latent_dim, generator=generator)
        eps = torch.randn(batch, self.config.input_len, generator=generator)
        x = z @ self.patterns + self.config.noise * eps
        theta = self.angle(t_s)
        if self.config.classes == 2:
            y = (z[:, 0] * math.cos(theta) + z[:, 1] * math.sin(theta) > 0).long()
        else:
            turned = torch.remainder(torch.atan2(z[:, 1], z[:, 0]) - theta, 2 * math.pi)
            y = torch.clamp((turned * (self.config.classes / (2 * math.pi))).long(), 0, self.config.classes - 1)
        return x.unsqueeze(1), y


def request_generator(seed: int, index: int) -> torch.Generator:
    """The generator of inference request `index`: independent of timing, equal across runs."""
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + index * 7919 + 17) % (2**63))
    return g


def _smooth_patterns(length: int, count: int, seed: int) -> torch.Tensor:
    """`count` fixed sums of low-frequency sinusoids, each with unit mean square ([count, length])."""
    g = torch.Generator()
    g.manual_seed(seed)
    pos = torch.arange(length, dtype=torch.float64) / length
    rows = []
    for _ in range(count):
        freqs = torch.randint(1, 24, (4,), generator=g).double()
        phases = torch.rand(4, generator=g, dtype=torch.float64) * 2 * math.pi
        amps = torch.rand(4, generator=g, dtype=torch.float64) + 0.5
        row = (amps[:, None] * torch.sin(2 * math.pi * freqs[:, None] * pos + phases[:, None])).sum(0)
        rows.append(row / row.pow(2).mean().sqrt())
    return torch.stack(rows).float()
