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
                 clock: Callable[[], float] = time.monotonic, start_iteration: int = 0, name: str = "interval"):
        if every_iters is None and every_s is None:
            raise ValueError("IntervalPolicy: give every_iters, every_s or both")
        if every_iters is not None and every_iters < 1:
            raise ValueError(f"IntervalPolicy: every_iters must be >= 1, got {every_iters}")
        if every_s is not None and not every_s > 0:
            raise ValueError(f"IntervalPolicy: every_s must be > 0, got {every_s}")
        self.every_iters = every_iters
        self.every_s = every_s
        self._clock = clock
        self.name = name
        self._last_iter = start_iteration
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
        return {"policy": self.name, "every_iters": self.every_iters, "every_s": self.every_s}


class IppPolicy(PublishPolicy):
    """Checkpoints chosen online by the Inference Performance Predictor (a viper.Scheduler).

    The scheduler is made before the run from what the warm-up measured (run_policies.py writes
    its arguments: the warm-up losses as `history`, the time per iteration, publish stall t_p and
    update latency t_c, the request rate and count), so its plan and predicted CIL exist before
    the first step. The same scheduler object is handed to viper.Publisher(scheduler=...), which
    feeds it every publish stall (t_p) and, from the consumer's ACKs, the time until a version is
    served (t_c); it measures the time per iteration itself, refits the loss curve and re-plans as
    the run goes. This policy only asks it: should_publish = scheduler.step(iteration, loss)."""

    def __init__(self, scheduler, setup: dict):
        self.scheduler = scheduler
        self.setup = setup
        self.initial = scheduler.state()  # the plan before the run

    def should_publish(self, iteration: int, loss: float) -> bool:
        return bool(self.scheduler.step(iteration, loss))

    def describe(self) -> dict:
        return {"policy": "ipp", "setup": {k: v for k, v in self.setup.items() if k != "history"},
                "initial": self.initial, "state": self.scheduler.state()}


def make_scheduler(viper_module, setup: dict):
    """viper.Scheduler from the JSON arguments run_policies.py writes (see IppPolicy)."""
    args = dict(setup)
    args["history"] = [tuple(p) for p in args.get("history", [])]
    policy = args.pop("policy")
    return viper_module.Scheduler(policy, **args)
