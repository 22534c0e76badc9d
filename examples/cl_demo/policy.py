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


class IppPolicy(PublishPolicy):
    """Checkpoints chosen by the Inference Performance Predictor (viper.Scheduler).

    The run is bounded by wall-clock time while the IPP plans in iterations, so the scheduler is
    made at the end of the warm-up (iteration s = warmup_iters): the time per iteration so far
    gives t_train and the last iteration e = s + remaining time / t_train; requests M = duration /
    request interval, t_infer = request interval. It gets every loss seen so far, fits the curve,
    plans, and from then on answers every step; publish stalls are reported to it (t_p: the estimate
    t_p_s is replaced by the stall of the warm-up checkpoint, which triggers a re-plan), and t_c
    stays at its estimate. `policy` is any of viper's schedulers: epoch (every epoch_iters,
    default (e - s) / 4), fixed (best constant interval), greedy, sqrt, optimal.
    describe() reports the plan, its predicted CIL, and the predicted CIL of every other policy on
    the same fitted curve and costs (viper.plan_schedules), to print beside the measured CIL."""

    def __init__(self, policy: str, warmup_iters: int, duration_s: float, request_interval_s: float,
                 epoch_iters: int = 0, t_p_s: float = 0.1, t_c_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic):
        import viper  # noqa: PLC0415 (only this policy needs the bindings)
        if warmup_iters < 2:
            raise ValueError(f"IppPolicy: warmup_iters must be >= 2, got {warmup_iters}")
        self._viper = viper
        self.policy = policy
        self.warmup_iters = warmup_iters
        self.duration_s = duration_s
        self.request_interval_s = request_interval_s
        self.epoch_iters = epoch_iters
        self.t_p_s = t_p_s
        self.t_c_s = t_c_s
        self._clock = clock
        self._start: Optional[float] = None
        self._samples = []
        self._stalls = []
        self._scheduler = None
        self._plan: dict = {}

    def should_publish(self, iteration: int, loss: float) -> bool:
        now = self._clock()
        if self._start is None:
            self._start, self._first = now, iteration
        if self._scheduler is None:
            self._samples.append((iteration, loss))
            if iteration < self.warmup_iters:
                return False
            self._make_scheduler(iteration, now)
            for it, value in self._samples[:-1]:
                self._scheduler.observe(it, value)
        return self._scheduler.step(iteration, loss)

    def _make_scheduler(self, s: int, now: float) -> None:
        t_train = max(1e-6, (now - self._start) / max(1, s - self._first))
        remaining = max(0.0, self.duration_s - (now - self._start))
        e = s + max(2, int(remaining / t_train))
        epoch = self.epoch_iters or max(1, (e - s) // 4)
        requests = max(1, int(self.duration_s / self.request_interval_s))
        t_p = sorted(self._stalls)[len(self._stalls) // 2] if self._stalls else self.t_p_s
        costs = dict(t_train=t_train, t_p=t_p, t_c=self.t_c_s, t_infer=self.request_interval_s, requests=requests)
        self._scheduler = self._viper.Scheduler(self.policy, warmup_end=s, end=e, epoch=epoch, **costs)
        alternatives = self._viper.plan_schedules(self._samples, warmup_end=s, end=e, epoch=epoch, **costs)
        self._plan = {"warmup_end": s, "end": e, "epoch": epoch, **costs,
                      "predicted_cil_by_policy": {p["name"]: p["cil"] for p in alternatives["schedules"]},
                      "checkpoints_by_policy": {p["name"]: p["checkpoints"] for p in alternatives["schedules"]}}

    def on_published(self, iteration: int, stall_s: float) -> None:
        self._stalls.append(stall_s)
        if self._scheduler is not None:
            self._scheduler.report_publish_stall(stall_s)

    def describe(self) -> dict:
        out = {"policy": f"ipp-{self.policy}", "warmup_iters": self.warmup_iters, "plan": self._plan}
        if self._scheduler is not None:
            out["state"] = self._scheduler.state()
        return out
