"""How model versions travel from the producer to the consumer: one small class per transport.

A Transport has two sides, used by two different processes:

producer side
    start_producer()                       once, before the first publish
    prepare(state_dict)                    optional, once: make ready for versions like this one
    publish(state_dict, step, meta) -> s   hand over one version; returns the seconds the caller
                                           was blocked (the training stall the transport reports)
    close()                                flush what is in flight and release everything

consumer side
    start_consumer(deadline_ns)            connect/prepare; may wait for the producer until deadline
    next_update(into, current, timeout_s)  block until a version newer than `current` is available,
                                           load it into the module `into` (which nobody else reads
                                           meanwhile) and return an Update; None after timeout_s
    served(version)                        the version now answers requests (Viper: the ACK a
                                           producer's IPP measures t_c with)
    close()

Versions are numbered by the transport, starting at 1 and increasing; version 0 is the model both
processes start from. The producer-side `step` (training iteration) travels with every version and
is the key that joins producer and consumer records.

Implementations:
- FileTransport: what users have today. torch.save to <dir>/model-<v>.pt.tmp, os.replace to
  model-<v>.pt; the consumer polls the directory every poll_interval_s, torch.load's the newest file
  and load_state_dict's it.
- ViperTransport: the `viper` Python bindings (memory path, push notification). Optional: when
  `import viper` fails, viper_import_error() says why and the driver runs without it.
- NoUpdateTransport: publishes nothing and never updates (the reference run: training without
  publishing, and a consumer that serves its first model forever).
"""
from __future__ import annotations

import abc
import dataclasses
import os
import re
import time
from typing import Any, Dict, Optional

import torch
from torch import nn


@dataclasses.dataclass
class Update:
    """One version loaded by the consumer. Times are CLOCK_REALTIME ns (time.time_ns())."""
    version: int
    step: int
    detected_ns: int                     # the consumer learned of the version (poll hit / notify)
    loaded_ns: int                       # the version's weights are in the spare module
    completed_ns: Optional[int] = None   # the version was complete at the producer, if known
    transport_timings: Dict[str, Any] = dataclasses.field(default_factory=dict)


class Transport(abc.ABC):
    """See the module docstring. An instance serves one side in one process; not thread-safe
    except where a method says otherwise."""

    name = "abstract"

    def start_producer(self) -> None:
        pass

    def prepare(self, state_dict: Dict[str, torch.Tensor]) -> None:
        """Optional, once before the first publish: make ready for versions like `state_dict`.
        REQUIRES: start_producer()."""

    @abc.abstractmethod
    def publish(self, state_dict: Dict[str, torch.Tensor], step: int, meta: Dict[str, Any]) -> float:
        """Publishes one version; returns the stall in seconds. REQUIRES: start_producer()."""

    def start_consumer(self, deadline_ns: int) -> None:
        pass

    @abc.abstractmethod
    def next_update(self, into: nn.Module, current: int, timeout_s: float) -> Optional[Update]:
        """Loads the newest version if it is newer than `current` (waiting up to timeout_s for one).
        REQUIRES: start_consumer()."""

    def served(self, version: int) -> None:
        """The consumer swapped `version` in: it answers requests from now on."""

    def close(self) -> None:
        pass

    def describe(self) -> Dict[str, Any]:
        """Settings to record with the results."""
        return {"name": self.name}


class NoUpdateTransport(Transport):
    """The reference: nothing is published, the consumer keeps version 0."""

    name = "none"

    def publish(self, state_dict, step, meta) -> float:
        return 0.0

    def next_update(self, into, current, timeout_s):
        time.sleep(max(0.0, timeout_s))
        return None


_FILE_RE = re.compile(r"^model-(\d+)\.pt$")


class FileTransport(Transport):
    """torch.save + rename on the producer; a consumer polling the directory and torch.load'ing."""

    name = "file"

    def __init__(self, directory: str, poll_interval_s: float = 1.0, keep_last: int = 3):
        if poll_interval_s <= 0:
            raise ValueError(f"FileTransport: poll_interval_s must be > 0, got {poll_interval_s}")
        if keep_last < 1:
            raise ValueError(f"FileTransport: keep_last must be >= 1, got {keep_last}")
        self.directory = directory
        self.poll_interval_s = poll_interval_s
        self.keep_last = keep_last
        self._version = 0
        self._next_poll_ns: Optional[int] = None

    def describe(self):
        return {"name": self.name, "directory": self.directory,
                "poll_interval_s": self.poll_interval_s, "keep_last": self.keep_last}

    def _path(self, version: int) -> str:
        return os.path.join(self.directory, f"model-{version:06d}.pt")

    def start_producer(self) -> None:
        self._make_directory()

    def _make_directory(self) -> None:
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise OSError(f"FileTransport: cannot create the model directory {self.directory}: {e.strerror}") from e

    def publish(self, state_dict, step, meta) -> float:
        start = time.perf_counter()
        self._version += 1
        path = self._path(self._version)
        payload = {"state_dict": state_dict,
                   "meta": dict(meta, version=self._version, step=step)}
        torch.save(payload, path + ".tmp")
        os.replace(path + ".tmp", path)  # readers see the whole file or none of it
        self._drop_old()
        return time.perf_counter() - start

    def _drop_old(self) -> None:
        """Retention: keeps the newest keep_last files, so a long run does not fill the disk."""
        old = self._version - self.keep_last
        if old >= 1:
            try:
                os.unlink(self._path(old))
            except FileNotFoundError:
                pass

    def start_consumer(self, deadline_ns: int) -> None:
        self._make_directory()

    def newest_version(self) -> int:
        """Highest complete version in the directory (0 if none)."""
        best = 0
        for entry in os.listdir(self.directory):
            m = _FILE_RE.match(entry)
            if m:
                best = max(best, int(m.group(1)))
        return best

    def next_update(self, into, current, timeout_s):
        """Polls on a fixed grid of ticks poll_interval_s apart, the first at the first call. A tick
        that passed while a load ran is taken as soon as the load is done (once, however many
        passed), then the grid goes on."""
        interval_ns = int(self.poll_interval_s * 1e9)
        give_up_ns = time.time_ns() + int(timeout_s * 1e9)
        if self._next_poll_ns is None:
            self._next_poll_ns = time.time_ns()
        while self._next_poll_ns <= give_up_ns:
            _sleep_until_ns(self._next_poll_ns)
            behind_ns = time.time_ns() - self._next_poll_ns
            self._next_poll_ns += interval_ns * (behind_ns // interval_ns + 1)
            update = self._load_newest(into, current)
            if update is not None:
                return update
        _sleep_until_ns(give_up_ns)
        return None

    def _load_newest(self, into: nn.Module, current: int) -> Optional[Update]:
        version = self.newest_version()
        if version <= current:
            return None
        detected_ns = time.time_ns()
        path = self._path(version)
        try:
            completed_ns = os.stat(path).st_mtime_ns  # last write, just before the rename
            payload = torch.load(path)
        except FileNotFoundError:
            return None  # retention removed it between listdir and open: a newer one exists
        fetched_ns = time.time_ns()
        into.load_state_dict(payload["state_dict"])
        meta = payload["meta"]
        # The kernel stamps mtime from its coarse clock (one scheduler tick, up to 4-10 ms behind the
        # time read by time.time_ns()): a small file written within a tick of publish() can carry an
        # mtime before the publish began. The write completed no earlier than either.
        if meta.get("publish_ns"):
            completed_ns = max(completed_ns, int(meta["publish_ns"]))
        # The same milestones as Viper's timings: complete (the file's last write), the consumer
        # told (its poll found the file), the bytes in the consumer (torch.load done).
        return Update(version=version, step=int(meta["step"]), detected_ns=detected_ns,
                      loaded_ns=time.time_ns(), completed_ns=completed_ns,
                      transport_timings={"publish_ns": meta.get("publish_ns"), "completed_ns": completed_ns,
                                         "notified_ns": detected_ns, "fetched_ns": fetched_ns,
                                         "live_ns": fetched_ns})


def _sleep_until_ns(deadline_ns: int) -> None:
    left = deadline_ns - time.time_ns()
    if left > 0:
        time.sleep(left / 1e9)


_viper_module = None
_viper_error: Optional[str] = None


def viper_import_error() -> Optional[str]:
    """None if `import viper` works, else the reason it does not."""
    global _viper_module, _viper_error
    if _viper_module is None and _viper_error is None:
        try:
            import viper  # noqa: PLC0415 (optional dependency)
            _viper_module = viper
        except ImportError as e:  # the bindings are not built or not on PYTHONPATH
            _viper_error = f"{type(e).__name__}: {e}"
    return _viper_error


class ViperTransport(Transport):
    """The Viper bindings. The only code in the demo that touches `viper`.

    API used (the bindings' contract with this demo):
      pub = viper.Publisher(model, listen="127.0.0.1:PORT")
      pub.prepare(state_dict)  -> makes the first segment in the background, returns at once
      pub.publish(state_dict, step=int, loss=float)  -> async; returns the stall in seconds (a
          float) or an object; otherwise pub.last_stall_seconds is read
      pub.close()
      sub = viper.Subscriber(model, connect="127.0.0.1:PORT")
      sub.wait_for(version, timeout_seconds)  -> returns when a version >= `version` is live, or on
          timeout (returning a falsy value or raising TimeoutError)
      sub.latest()  -> None or a snapshot with .version, .step, .timings (dict with at least
          'completed_ns' and 'live_ns', CLOCK_REALTIME ns)
      sub.load_into(module)  -> copies the live version into module's parameters; if it returns an
          object with .version, that is the version it loaded
      sub.close()
    """

    name = "viper"

    def __init__(self, address: str, model: str = "nt3", address_file: str | None = None, scheduler=None):
        """`address`: where the producer's node listens; with port 0 the node picks a free port and
        the producer writes the address it got to `address_file`, where the consumer reads it (a
        port chosen ahead by the parent could be taken by another process before the node binds).
        `scheduler`: a viper.Scheduler the producer's Publisher feeds (stalls, and t_c from the
        consumer's ACKs). The consumer ACKs a version once it serves it (served()), after its own
        load_into, not when the subscriber maps it: so t_c is what requests see."""
        err = viper_import_error()
        if err is not None:
            raise RuntimeError(f"ViperTransport: the viper Python bindings are not importable ({err})")
        if address.endswith(":0") and not address_file:
            raise ValueError("ViperTransport: listening on port 0 needs an address_file for the consumer")
        self.address = address
        self.model = model
        self.address_file = address_file
        self.scheduler = scheduler
        self._pub = None
        self._sub = None

    def describe(self):
        return {"name": self.name, "address": self.address, "model": self.model}

    def start_producer(self) -> None:
        self._pub = _viper_module.Publisher(self.model, listen=self.address, scheduler=self.scheduler)
        if self.address_file:
            self.address = self._pub.address
            tmp = self.address_file + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self.address + "\n")
            os.replace(tmp, self.address_file)  # the consumer never reads a half-written address

    def prepare(self, state_dict) -> None:
        self._pub.prepare(state_dict)  # the first segment, made while the processes get ready

    def publish(self, state_dict, step, meta) -> float:
        start = time.perf_counter()
        ret = self._pub.publish(state_dict, step=step, loss=float(meta.get("loss", float("nan"))))
        wall = time.perf_counter() - start
        if isinstance(ret, (int, float)) and not isinstance(ret, bool):
            return float(ret)
        reported = getattr(self._pub, "last_stall_seconds", None)
        return float(reported) if reported is not None else wall

    def start_consumer(self, deadline_ns: int) -> None:
        """Connects, retrying while the producer's node is not listening yet (or, with port 0,
        has not written its address yet)."""
        while self.address.endswith(":0"):
            try:
                with open(self.address_file, encoding="utf-8") as f:
                    self.address = f.read().strip()
            except FileNotFoundError:
                if time.time_ns() >= deadline_ns:
                    raise RuntimeError(f"ViperTransport: the producer wrote no address to {self.address_file}") from None
                time.sleep(0.05)
        while True:
            try:
                self._sub = _viper_module.Subscriber(self.model, connect=self.address, ack_on_live=False)
                return
            except Exception as e:  # noqa: BLE001 (the bindings' connection error type is theirs)
                if time.time_ns() >= deadline_ns:
                    raise RuntimeError(f"ViperTransport: cannot connect to {self.address}: {e}") from e
                time.sleep(0.1)

    def next_update(self, into, current, timeout_s):
        snap = self._sub.latest()
        if snap is None or snap.version <= current:
            try:
                self._sub.wait_for(current + 1, timeout_s)
            except TimeoutError:
                return None
            snap = self._sub.latest()
            if snap is None or snap.version <= current:
                return None
        detected_ns = time.time_ns()
        loaded = self._sub.load_into(into)
        loaded_ns = time.time_ns()
        if hasattr(loaded, "version"):
            snap = loaded
        timings = dict(getattr(snap, "timings", {}) or {})
        return Update(version=int(snap.version), step=int(snap.step), detected_ns=detected_ns,
                      loaded_ns=loaded_ns, completed_ns=timings.get("completed_ns"),
                      transport_timings=timings)

    def served(self, version: int) -> None:
        try:
            self._sub.ack(version)
        except _viper_module.Error:  # the producer's node is gone (its run ended): nobody to tell
            pass

    def close(self) -> None:
        for handle in (self._pub, self._sub):
            if handle is not None:
                handle.close()
        self._pub = self._sub = None


def make_transport(name: str, workdir: str, cfg, scheduler=None) -> Transport:
    """The transport called `name` ("none", "file" or "viper") for the run in `workdir`, with the
    settings of DemoConfig `cfg` (file_dir, poll_interval_s, viper_address); `scheduler` (viper
    only): the producer's viper.Scheduler."""
    if name == "none":
        return NoUpdateTransport()
    if name == "file":
        return FileTransport(cfg.file_dir or os.path.join(workdir, "models"), poll_interval_s=cfg.poll_interval_s)
    if name == "viper":
        return ViperTransport(cfg.viper_address, address_file=os.path.join(workdir, "viper.address"), scheduler=scheduler)
    raise ValueError(f"unknown transport {name!r}: expected none, file or viper")
