"""viper.neardata.Tuner: FT-DMP's compute side. Owns the trainable layers (the module's `head`),
trains them on the features the PipeStores publish, and publishes each round's model as a new
version (the stores receive it as a delta: only the head changed).

A job of R rounds (epochs x chunks) is announced in the version's metadata (ft_job, ft_rounds,
ft_chunks, ft_depth; ft_round: the last round trained into these weights; ft_taken: the last
round whose features the Tuner holds). Round k uses chunk k % chunks of every store. A store
extracts round k once it holds a version with ft_round >= k-1-depth and publishes it once it
holds one with ft_taken >= k-1: the Tuner has taken every earlier features version of that store
before the next replaces it, so no round is skipped.
Non-pipelined (depth 0), the Tuner publishes after training each round (ft_round = ft_taken = k)
and waits while the stores extract the next. Pipelined (depth 2), it publishes as soon as it has
taken round k (ft_round = k-1, ft_taken = k) and trains round k while the stores send round k+1,
which they extracted while waiting for that version: a store starts round k+1 as soon as it has
published round k, so neither the extraction nor the round trip (the Tuner's version reaching
the stores, their features reaching the Tuner) waits on the Tuner's training. (Depth 1, where a
store starts round k+1 only once the Tuner has taken round k, puts that round trip and the whole
extraction on the Tuner's path every round that the extraction takes about as long as its
training.) The features do not depend on ft_round: the frozen layers are the same in every
version of a job; what the depth bounds is how far the stores' head lags.
"""
from __future__ import annotations

import secrets
import time
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch

from . import Publisher, Subscriber, ViperTimeoutError as ViperTimeout
from . import _Closable, _close_at_exit


def train_round(module, optimizer, x: torch.Tensor, y: torch.Tensor, *, seed: int, round_index: int,
                minibatch: int, local_epochs: int) -> float:
    """SGD on module.head over the features x (labels y), in an order fixed by (seed, round):
    the near-data Tuner and the baseline train on the same order. Returns the mean loss."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + round_index)
    module.head.train()
    losses = []
    for _ in range(local_epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), minibatch):
            idx = order[start:start + minibatch]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(module.head(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
    module.head.eval()
    return float(np.mean(losses)) if losses else 0.0


def make_optimizer(module, lr: float):
    return torch.optim.SGD(module.head.parameters(), lr=lr, momentum=0.9)


def accuracy(module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy of the whole module on inputs x."""
    module.eval()
    with torch.no_grad():
        return float((module(x).argmax(dim=1) == y).float().mean())


class Tuner(_Closable):
    """Trains the trainable layers from the stores' features and publishes the model.

    stores: name -> "host:port" of each PipeStore's features_listen. The embedded Publisher
    listens on `listen` (the stores subscribe to it); publisher_options go to it; `token` is the
    shared secret of it and of the stores' features nodes. Not
    thread-safe: one thread drives it."""

    def __init__(self, model: str, factory, stores: Dict[str, str], *, listen: str = "127.0.0.1:0",
                 lr: float = 0.05, seed: int = 0, minibatch: int = 64, local_epochs: int = 1,
                 token: str = "", subscriber_options: Optional[dict] = None, **publisher_options: Any):
        from .neardata import load_callable
        self.model = model
        self.module = load_callable(factory)()
        self.module.eval()
        for p in self.module.backbone.parameters():
            p.requires_grad_(False)
        self.stores = dict(stores)
        self.lr, self.seed, self.minibatch, self.local_epochs = lr, int(seed), int(minibatch), int(local_epochs)
        self._sub_options = dict(subscriber_options or {}, token=token)
        self.publisher = Publisher(model, listen=listen, token=token, **publisher_options)
        self._subs: Dict[str, Subscriber] = {}
        _close_at_exit(self)

    @property
    def address(self) -> str:
        return self.publisher.address

    def publish(self, **metadata: Any):
        """Publishes the module as it is now (e.g. the version stores relabel with)."""
        return self.publisher.publish(self.module.state_dict(), **metadata)

    def _subscriber(self, name: str) -> Subscriber:
        if name not in self._subs:
            from .neardata import FEATURES_STREAM
            self._subs[name] = Subscriber(FEATURES_STREAM.format(model=self.model, store=name),
                                          connect=self.stores[name], **self._sub_options)
        return self._subs[name]

    def _take(self, name: str, job: str, k: int, deadline: float):
        """Round k's features from store `name` (copied out of the version)."""
        sub = self._subscriber(name)
        while True:
            v = sub.latest()
            if v is not None and v.metadata.get("ft_job") == job:
                r = int(v.metadata["ft_round"])
                if r == k:  # in id order, whatever order the store's readers delivered them in
                    order = np.argsort(np.asarray(v["ids"]), kind="stable")
                    return np.asarray(v["x"])[order], np.asarray(v["y"])[order], int(v.wire_bytes)
                if r > k:
                    raise RuntimeError(f"store {name}: features of round {r} arrived while waiting for round {k}")
            if time.monotonic() > deadline:
                raise ViperTimeout(f"store {name}: no features of round {k} of job {job}")
            try:
                sub.wait_for((v.version if v is not None else 0) + 1, timeout=0.2)
            except ViperTimeout:
                pass

    def finetune(self, epochs: int = 1, chunks: int = 4, *, pipelined: bool = True, timeout: float = 300.0,
                 on_round: Optional[Callable[[dict], None]] = None) -> dict:
        """Runs one job of epochs x chunks rounds. Returns rounds, seconds, busy_seconds,
        busy_fraction (training and publishing over the time from round 0's features being in to
        the end: the pipeline's fill is fill_seconds), busy_cpu_seconds (the CPU time of that work:
        below busy_seconds when the stores share the Tuner's cores), process_cpu_seconds (this
        process's CPU time over the job, every thread), feature_wire_bytes, losses, timeline (per
        round: wait, the seconds waiting for the features; last_store, the store waited for last;
        train; publish)."""
        from . import InvalidArgumentError
        for name, value in (("epochs", epochs), ("chunks", chunks)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"Tuner.finetune(): {name}={value!r}: must be an int >= 1")
        if not self.stores:
            raise InvalidArgumentError("Tuner.finetune(): no stores: set Tuner.stores to {name: features address}")
        for name in self.stores:
            self._subscriber(name)
        job = secrets.token_hex(4)
        rounds, depth = int(epochs) * int(chunks), 2 if pipelined else 0
        meta = {"ft_job": job, "ft_rounds": str(rounds), "ft_chunks": str(chunks), "ft_depth": str(depth)}
        optimizer = make_optimizer(self.module, self.lr)
        started, process_cpu = time.monotonic(), time.process_time()
        self.publish(ft_round="-1", ft_taken="-1", **meta)
        busy = fill = cpu = 0.0
        feature_bytes = 0
        losses, timeline = [], []
        for k in range(rounds):
            t0 = time.monotonic()
            parts, last = [], None
            for name in self.stores:
                parts.append(self._take(name, job, k, t0 + timeout))
                if time.monotonic() - t0 > 1e-3:
                    last = name
            t1 = time.monotonic()
            if k == 0:
                fill = t1 - started
            if pipelined:  # round k is taken: the stores may publish round k+1 while it trains
                self.publish(ft_round=str(k - 1), ft_taken=str(k), **meta)
            t2 = time.monotonic()
            c1 = time.thread_time()
            x = torch.from_numpy(np.concatenate([p[0] for p in parts]))
            y = torch.from_numpy(np.concatenate([p[1] for p in parts]))
            feature_bytes += sum(p[2] for p in parts)
            loss = train_round(self.module, optimizer, x, y, seed=self.seed, round_index=k,
                               minibatch=self.minibatch, local_epochs=self.local_epochs)
            t3 = time.monotonic()
            if not pipelined or k == rounds - 1:
                self.publish(ft_round=str(k), ft_taken=str(k), **meta)
            t4 = time.monotonic()
            busy += t4 - t1
            cpu += time.thread_time() - c1
            losses.append(loss)
            timeline.append({"round": k, "wait": t1 - t0, "last_store": last, "publish": (t2 - t1) + (t4 - t3),
                             "train": t3 - t2})
            if on_round is not None:
                on_round({"round": k, "loss": loss, "samples": len(y), "wait_seconds": t1 - t0})
        seconds = time.monotonic() - started
        process_cpu = time.process_time() - process_cpu
        return {"job": job, "rounds": rounds, "pipelined": pipelined, "seconds": seconds, "fill_seconds": fill,
                "busy_seconds": busy, "busy_cpu_seconds": cpu, "busy_fraction": busy / max(seconds - fill, 1e-9),
                "feature_wire_bytes": feature_bytes, "process_cpu_seconds": process_cpu, "losses": losses, "timeline": timeline}

    def close(self) -> None:
        for sub in self._subs.values():
            sub.close()
        self._subs.clear()
        self.publisher.close()
