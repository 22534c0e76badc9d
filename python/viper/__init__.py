"""Viper: model versions from a training job to inference servers, memory to memory.

    import viper

    # producer (embeds a node; consumers connect to its address)
    with viper.Publisher("nt3", listen="127.0.0.1:7700") as pub:
        for step in range(steps):
            loss = train_step()
            if step % 100 == 0:
                pub.publish(model.state_dict(), step=step, loss=loss)   # returns a PublishResult

    # consumer (another process, same host or not)
    with viper.Subscriber("nt3", connect="127.0.0.1:7700") as sub:
        version = sub.wait_for(1, timeout=30)    # blocks (GIL released) until version >= 1 is live
        sub.load_into(serving_model)             # copies into the existing parameters
        version["fc.weight"]                     # read-only numpy view of the version, no copy

Options are keyword arguments with the names and defaults of the C++ options
(include/viper/{node,publisher,subscriber}.h); times are in seconds. Errors raise subclasses of
`viper.Error` that also subclass the fitting builtin: InvalidArgumentError (ValueError),
NotFoundError (LookupError), TimeoutError (TimeoutError), IOError (OSError).
Every handle has close() and works as a context manager.
"""
from __future__ import annotations

import textwrap
from typing import Any, Mapping, Optional

from . import _tensors
from ._viper import (  # noqa: F401 (re-exported)
    Error,
    InvalidArgumentError,
    IOError,
    ModelVersion,
    NotFoundError,
    PublishResult,
    Snapshot,
    TimeoutError,
    __version__,
)
from . import _viper

from ._viper import Scheduler, plan_schedules  # noqa: F401 (the Inference Performance Predictor)

__all__ = ["Error", "InvalidArgumentError", "IOError", "ModelVersion", "Node", "NotFoundError", "PublishResult",
           "Publisher", "Scheduler", "Snapshot", "Subscriber", "TimeoutError", "build_snapshot", "plan_schedules",
           "__version__"]


class _Handle:
    """close() once (later calls do nothing) and the context-manager protocol."""

    _impl: Any = None

    def close(self) -> None:
        impl, self._impl = self._impl, None
        if impl is not None:
            impl.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    def _live(self):
        if self._impl is None:
            raise Error(f"{type(self).__name__} is closed")
        return self._impl


class Node(_Handle):
    """A Viper node on its own (what `viper serve` runs): holds versions in shared memory, serves
    subscribers, keeps the file tier. Publishers embed one; use this for a standalone node."""

    def __init__(self, listen: str = "127.0.0.1:0", **options: Any):
        self._impl = _viper._Node(_viper._NodeOptions(listen=listen, **options))

    @property
    def address(self) -> str:
        """"host:port" subscribers connect to."""
        return self._live().address

    def versions(self) -> list:
        """Every version held, as dicts (model, version, size, checksum, step, ..., replicas)."""
        return self._live().versions()

    def latest(self, model: str) -> Optional[dict]:
        """The newest version of `model`, or None."""
        return self._live().latest(model)

    def wait_flushed(self, timeout: float = 600.0) -> None:
        """Blocks until every version queued for the file tier is written."""
        self._live().wait_flushed(timeout)


class Publisher(_Handle):
    """Publishes versions of one model from a training process; embeds a node listening on `listen`.

    mode="async" (default): publish() copies the tensors into a (recycled) shared-memory segment
    and returns; sealing, announcing and the file-tier copy run in the background. "sync" returns
    when the version is announced. max_in_flight async versions may be queued before publish()
    blocks."""

    def __init__(self, model: str, listen: str = "127.0.0.1:0", *, scheduler: Optional[Scheduler] = None,
                 **options: Any):
        if scheduler is not None and not isinstance(scheduler, Scheduler):
            raise TypeError(f"scheduler must be a viper.Scheduler, got {type(scheduler).__name__}")
        self._impl = _viper._Publisher(_viper._PublisherOptions(model=model, listen=listen, **options), scheduler)

    def publish(self, tensors: Mapping[str, Any], step: int = 0, loss: Optional[float] = None,
                **metadata: Any) -> PublishResult:
        """Publishes `tensors` (a state_dict() or a dict of numpy arrays) as the next version.
        Extra keyword arguments become string metadata. Returns a PublishResult (version,
        stall_seconds: how long this call blocked training; wait_delta(): the delta the node
        prepares for consumers that fetch over the network). GIL released while copying."""
        if step < 0:
            raise InvalidArgumentError(f"step must be >= 0, got {step}")
        entries = _tensors.to_entries(tensors)
        return self._live().publish(entries, int(step), None if loss is None else float(loss), metadata)

    def publish_if_due(self, iteration: int, loss: float, tensors: Mapping[str, Any], **metadata: Any):
        """With `scheduler=` (a viper.Scheduler): feeds it (iteration, loss) and publishes when it
        says a checkpoint is due; the tensors are not touched otherwise. Returns the PublishResult,
        or None. The publisher feeds the scheduler the stall of every publish (t_p) and, from the
        subscribers' acknowledgements, the time until a version is live at them (t_c)."""
        if not self._live().due(int(iteration), float(loss)):
            return None
        return self.publish(tensors, step=int(iteration), loss=float(loss), **metadata)

    def wait(self, timeout: float = 600.0) -> None:
        """Blocks until every queued version is announced; raises the first background error."""
        self._live().wait(timeout)

    @property
    def address(self) -> str:
        """"host:port" of the embedded node: what subscribers connect to."""
        return self._live().address

    @property
    def announced_version(self) -> int:
        """The latest version announced so far (0 if none)."""
        return self._live().announced_version

    @property
    def last_stall_seconds(self) -> float:
        """The stall of the last publish()."""
        return self._live().last_stall_seconds

    def versions(self) -> list:
        """The embedded node's versions, as dicts."""
        return self._live().versions()


class Subscriber(_Handle):
    """Keeps the newest complete version of one model live in a consumer process.

    A loader thread fetches each announced version by the cheapest path (path="auto": map the
    node's segment when on the same host, else copy, UCX, or the file tier), verifies it and swaps
    it in; latest() never returns a torn model. Bytes that crossed the network or came from a file
    are checksum-verified (verify_checksum); bytes of the node's segment on this host are trusted
    unless verify_local=True."""

    def __init__(self, model: str, connect: str = "127.0.0.1:7300", **options: Any):
        self._impl = _viper._Subscriber(_viper._SubscriberOptions(model=model, connect=connect, **options))

    def latest(self) -> Optional[ModelVersion]:
        """The live version (a read-only mapping of numpy views), or None before the first."""
        return self._live().latest()

    def wait_for(self, version: int = 1, timeout: float = 60.0) -> ModelVersion:
        """Blocks (GIL released) until a version >= `version` is live and returns it; raises
        viper.TimeoutError after `timeout` seconds."""
        if version < 0:
            raise InvalidArgumentError(f"version must be >= 0, got {version}")
        return self._live().wait_for(int(version), float(timeout))

    def wait(self, timeout: float = 60.0) -> ModelVersion:
        """Blocks until the next version after the live one is live (the first, if none is)."""
        current = self.latest()
        return self.wait_for((current.version if current is not None else 0) + 1, timeout)

    def load_into(self, module: Any, version: Optional[ModelVersion] = None, strict: bool = True) -> ModelVersion:
        """Copies `version` (default: the live one) into a torch module's existing parameters and
        buffers (or a dict of tensors) without reallocating them; returns the version loaded.
        Raises NotFoundError if no version is live yet, ValueError if names or shapes differ."""
        if version is None:
            version = self.latest()
            if version is None:
                raise NotFoundError("load_into: no version is live yet (use wait_for first)")
        _tensors.copy_into_module(version, module, strict=strict)
        return version

    def ack(self, version: int) -> None:
        """With ack_on_live=False: tells the producer's node that `version` is now served here (a
        Publisher with a Scheduler measures t_c up to this ACK)."""
        self._live().ack(int(version))

    def stats(self) -> dict:
        """notifies, updates, skipped, fetch_failures, deltas (versions that came as a delta),
        delta_fallbacks (deltas that failed and were fetched in full)."""
        return self._live().stats()

    def last_error(self) -> Optional[str]:
        """Why the last update failed, or None."""
        return self._live().last_error()


# Each class's keyword arguments, with their defaults, from the one table in python/src/module.cc.
Node.__doc__ += "\n\n" + textwrap.indent(_viper._NodeOptions.__doc__, "    ")
Publisher.__doc__ += "\n\n" + textwrap.indent(_viper._PublisherOptions.__doc__ + "  scheduler (None): a viper.Scheduler "
                                               "that decides when publish_if_due() publishes\n", "    ")
Subscriber.__doc__ += "\n\n" + textwrap.indent(_viper._SubscriberOptions.__doc__, "    ")


def build_snapshot(tensors: Mapping[str, Any], *, model: str = "", version: int = 0, step: int = 0,
                   loss: Optional[float] = None, alignment: int = 64, **metadata: Any) -> Snapshot:
    """A sealed safetensors Snapshot built from `tensors` (copied once), e.g. to save() to a file."""
    return Snapshot._build(_tensors.to_entries(tensors), model, int(version), int(step),
                           None if loss is None else float(loss), metadata, int(alignment))
