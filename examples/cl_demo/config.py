"""The settings of one demo, shared by the driver, the producer and the consumer (as a JSON file)."""
from __future__ import annotations

import dataclasses
import json
from typing import Optional

from cl_demo.data import StreamConfig
from cl_demo.model import ModelConfig


@dataclasses.dataclass
class DemoConfig:
    dense_mb: float = 300.0            # MiB of the model's wide dense weight
    duration_s: float = 40.0           # length of each run (producer training, consumer serving)
    period_s: float = 100.0            # seconds per full turn of the decision boundary (inf: none)
    classes: int = 2                   # 2: the drifting half-plane; K > 2: K sectors (policies stage)
    noise: float = 0.5
    data_seed: int = 1234              # patterns and request samples
    train_seed: int = 7                # training batches and initial weights
    train_batch: int = 8
    lr: float = 0.2
    pretrain_iters: int = 24           # steps on the t=0 distribution that make version 0
    pretrain_batch: int = 32
    publish_every_iters: Optional[int] = None
    publish_every_s: Optional[float] = 2.0
    request_interval_s: float = 0.25   # the consumer serves one request every this many seconds
    request_batch: int = 8             # samples per request; its loss is their mean cross-entropy
    poll_interval_s: float = 1.0       # FileTransport consumer
    file_dir: str = ""                 # FileTransport directory ("" = <run dir>/models)
    producer_threads: int = 1
    consumer_threads: int = 1
    init_path: str = ""                # version 0 (written by the driver)
    viper_address: str = "127.0.0.1:0"
    # The run continues a training that reached `start_iteration` (the policies stage's warm-up):
    # iterations are numbered from there, and the training batches come from a stream seeded by it.
    start_iteration: int = 0
    max_iterations: int = 0            # the producer stops after this iteration (0: duration only)
    save_final_path: str = ""          # the producer saves its final state_dict here
    # The IPP (policy.IppPolicy): a JSON file with viper.Scheduler's arguments, written by
    # run_policies.py. "" = no IPP (publish_every_* decide).
    ipp_path: str = ""

    def __post_init__(self):
        checks = {
            "duration_s": self.duration_s > 0, "train_batch": self.train_batch >= 1,
            "lr": self.lr > 0, "pretrain_iters": self.pretrain_iters >= 0,
            "pretrain_batch": self.pretrain_batch >= 1,
            "request_interval_s": self.request_interval_s > 0,
            "request_batch": self.request_batch >= 1, "poll_interval_s": self.poll_interval_s > 0,
            "producer_threads": self.producer_threads >= 1,
            "consumer_threads": self.consumer_threads >= 1,
            "classes": self.classes >= 2,
            "start_iteration": self.start_iteration >= 0,
            "max_iterations": self.max_iterations >= 0,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"DemoConfig: invalid {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)}")
        self.model_config()  # validates dense_mb
        self.stream_config()  # validates period_s, noise

    def model_config(self) -> ModelConfig:
        return ModelConfig(dense_mb=self.dense_mb, classes=self.classes)

    def stream_config(self) -> StreamConfig:
        return StreamConfig(input_len=self.model_config().input_len, period_s=self.period_s,
                            noise=self.noise, seed=self.data_seed, classes=self.classes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str) -> "DemoConfig":
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{path}: unknown DemoConfig keys {unknown}")
        return cls(**raw)
