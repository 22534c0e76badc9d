"""When the producer publishes: one swappable object.

The producer asks `should_publish(iteration, loss)` after every training step and, when it did
publish, reports the stall with `on_published(iteration, stall_s)`. A checkpoint schedule (epoch,
fixed interval, an IPP-chosen schedule that re-plans from measured stalls) is another class with
these two methods; nothing else in the producer changes.
"""
from __future__ import annotations

import time
from typing import Callable, Optional


class PublishPolicy:
    """Interface. Not thread-safe: the training loop calls it from one thread."""

    def should_publish(self, iteration: int, loss: float) -> bool:
        raise NotImplementedError

    def on_published(self, iteration: int, stall_s: float) -> None:
        """Feedback after a publish (the measured training stall): used by adaptive schedules."""

    def describe(self) -> dict:
        return {"policy": type(self).__name__}


class NeverPublish(PublishPolicy):
    def should_publish(self, iteration: int, loss: float) -> bool:
        return False


class IntervalPolicy(PublishPolicy):
    """Publishes every `every_iters` iterations or once `every_s` seconds of training passed since
    the last publish ended (or the first call), whichever comes first; None disables that trigger.
    Counting from the end of a publish, as a hand-written `if now - last_save > T` loop does, keeps
    a slow publish from eating the training time between two publishes."""

    def __init__(self, every_iters: Optional[int] = None, every_s: Optional[float] = None,
                 clock: Callable[[], float] = time.monotonic):
        if every_iters is None and every_s is None:
            raise ValueError("IntervalPolicy: give every_iters, every_s or both")
        if every_iters is not None and every_iters < 1:
            raise ValueError(f"IntervalPolicy: every_iters must be >= 1, got {every_iters}")
        if every_s is not None and not every_s > 0:
            raise ValueError(f"IntervalPolicy: every_s must be > 0, got {every_s}")
        self.every_iters = every_iters
        self.every_s = every_s
        self._clock = clock
        self._last_iter = 0
        self._last_time: Optional[float] = None

    def should_publish(self, iteration: int, loss: float) -> bool:
        now = self._clock()
        if self._last_time is None:
            self._last_time = now
        due = (self.every_iters is not None and iteration - self._last_iter >= self.every_iters) or \
              (self.every_s is not None and now - self._last_time >= self.every_s)
        if due:
            self._last_iter, self._last_time = iteration, now
        return due

    def on_published(self, iteration: int, stall_s: float) -> None:
        self._last_time = self._clock()

    def describe(self) -> dict:
        return {"policy": "interval", "every_iters": self.every_iters, "every_s": self.every_s}
