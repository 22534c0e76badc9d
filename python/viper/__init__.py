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
        serving_model.load_state_dict(version.state_dict())  # torch views of the version, no copy

Options are keyword arguments with the names and defaults of the C++ options
(include/viper/{node,publisher,subscriber}.h); times are in seconds. Errors raise subclasses of
`viper.Error` that also subclass the fitting builtin: InvalidArgumentError (ValueError),
NotFoundError (LookupError), ViperTimeoutError (TimeoutError), ViperIOError (OSError). The last two
were called viper.TimeoutError and viper.IOError: those names still work (the same classes) but are
not in __all__, so `from viper import *` leaves the builtins TimeoutError and IOError alone.
Every handle has close() and works as a context manager.
"""
from __future__ import annotations

import atexit
import collections  # noqa: F401 (annotations)
import itertools
import os
import textwrap
import weakref
from typing import Any, Mapping, Optional

from . import _checks as _check
from . import _tensors
from ._viper import (  # noqa: F401 (re-exported)
    Error,
    InvalidArgumentError,
    ModelVersion,
    NotFoundError,
    PublishResult,
    ViperIOError,
    ViperTimeoutError,
    __version__,
)
from . import _viper

# The former names of ViperIOError and ViperTimeoutError (same classes), outside __all__.
IOError = ViperIOError  # noqa: A001 (compatibility alias; `from viper import *` does not export it)
TimeoutError = ViperTimeoutError  # noqa: A001


_POLICIES = ("none", "epoch", "fixed", "greedy", "sqrt", "optimal")


def _losses(owner: str, name: str, pairs: Any) -> list:
    """(iteration, loss) pairs as a list of (int, float)."""
    if isinstance(pairs, (str, bytes, Mapping)) or not hasattr(pairs, "__iter__"):
        raise TypeError(f"{owner}: {name}={_check.shown(pairs)}: expected a sequence of (iteration, loss) pairs, "
                        f"got {type(pairs).__name__}")
    out = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"{owner}: {name}[{i}]={_check.shown(pair)}: expected an (iteration, loss) pair, "
                            f"got {type(pair).__name__}")
        out.append((_check.integer(owner, f"{name}[{i}] iteration", pair[0]),
                    _check.number(owner, f"{name}[{i}] loss", pair[1])))
    return out


class Scheduler(_viper.Scheduler):
    __doc__ = _viper.Scheduler.__doc__

    def __init__(self, policy: str = "optimal", *, warmup_end: int, end: int, epoch: int = 0, t_infer: float,
                 requests: int, t_train: float = 0.0, t_p: float = 0.0, t_c: float = 0.0, refit_every: int = 0,
                 checkpoint_at_warmup_end: bool = True, measure_t_train: bool = True, history: Any = (),
                 robust_fit: bool = True, duration: float = 0.0, checkpoint_cost_intervals: int = 3):
        o = "viper.Scheduler()"
        if _check.text(o, "policy", policy) not in _POLICIES:
            raise InvalidArgumentError(f"{o}: policy={_check.shown(policy)}: must be one of {', '.join(_POLICIES)}")
        super().__init__(policy, warmup_end=_check.integer(o, "warmup_end", warmup_end),
                         end=_check.integer(o, "end", end), epoch=_check.integer(o, "epoch", epoch),
                         t_infer=_check.seconds(o, "t_infer", t_infer, lo_open=True),
                         requests=_check.integer(o, "requests", requests, lo=1),
                         t_train=_check.seconds(o, "t_train", t_train), t_p=_check.seconds(o, "t_p", t_p),
                         t_c=_check.seconds(o, "t_c", t_c), refit_every=_check.integer(o, "refit_every", refit_every),
                         checkpoint_at_warmup_end=_check.boolean(o, "checkpoint_at_warmup_end", checkpoint_at_warmup_end),
                         measure_t_train=_check.boolean(o, "measure_t_train", measure_t_train),
                         history=_losses(o, "history", history), robust_fit=_check.boolean(o, "robust_fit", robust_fit),
                         duration=_check.seconds(o, "duration", duration),
                         checkpoint_cost_intervals=_check.integer(o, "checkpoint_cost_intervals",
                                                                  checkpoint_cost_intervals))
        # What load_state_dict() checks a state against (the options that shape the plan).
        self._identity = {"policy": policy, "warmup_end": int(warmup_end), "end": int(end), "epoch": int(epoch),
                          "requests": int(requests)}

    _STATE_FORMAT = "viper.Scheduler/1"
    _STATE_KEYS = ("losses", "intervals", "since_checkpoint", "checkpoint_in_interval", "stall_ns", "latency_ns",
                   "taken", "last_asked", "elapsed_ns", "end", "plans", "last_plan_iteration", "timings_moved",
                   "plan_iteration", "plan_end", "plan_t_train_ns", "plan_t_p_ns", "plan_t_c_ns")

    def state_dict(self) -> dict:
        """Everything needed to resume this scheduler in a restarted job (torch's state_dict
        convention: plain values, for torch.save next to the model's): every loss observed, the
        measured intervals and reported checkpoint costs (the estimates of t_train, t_p and t_c
        follow from them), the checkpoints taken, and where the current plan was made. Times are
        integer ns. The fitted curve and the plan are re-made by load_state_dict() from the same
        inputs, so they come out the same."""
        out = {"format": self._STATE_FORMAT, "options": dict(self._identity)}
        out.update(self._checkpoint())
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from a state_dict() of a scheduler made with the same options (policy,
        warmup_end, end, epoch and requests are checked; InvalidArgumentError naming the first that
        differs). The time between the two is not counted in `duration`, and the first interval
        after it is not measured (it spans the restart). InvalidArgumentError for a state that does
        not fit (the scheduler is unchanged then)."""
        o = "Scheduler.load_state_dict()"
        _check.mapping(o, "state", state, expected="a Scheduler.state_dict()")
        missing = [k for k in ("format", "options") + self._STATE_KEYS if k not in state]
        if missing:
            raise InvalidArgumentError(f"{o}: state lacks {', '.join(missing)}")
        if state["format"] != self._STATE_FORMAT:
            raise InvalidArgumentError(f"{o}: state format={_check.shown(state['format'])}: must be "
                                       f"{self._STATE_FORMAT!r}")
        theirs = state["options"]
        for key, mine in self._identity.items():
            if not isinstance(theirs, Mapping) or theirs.get(key) != mine:
                got = theirs.get(key) if isinstance(theirs, Mapping) else theirs
                raise InvalidArgumentError(f"{o}: state options {key}={_check.shown(got)}: this scheduler has {mine!r}")
        args = {k: state[k] for k in self._STATE_KEYS}
        args["losses"] = _losses(o, "state losses", args["losses"])
        args["intervals"] = [(_check.integer(o, f"state intervals[{i}]", p[0], lo=-1),
                              _check.integer(o, f"state intervals[{i}]", p[1], lo=1))
                             for i, p in enumerate(args["intervals"])]
        for key in ("stall_ns", "latency_ns", "taken"):
            args[key] = [_check.integer(o, f"state {key}[{i}]", v) for i, v in enumerate(args[key])]
        for key in ("since_checkpoint", "last_asked", "elapsed_ns", "last_plan_iteration", "plan_iteration"):
            args[key] = _check.integer(o, f"state {key}", args[key], lo=-1)
        for key in ("end", "plans", "plan_end", "plan_t_train_ns", "plan_t_p_ns", "plan_t_c_ns"):
            args[key] = _check.integer(o, f"state {key}", args[key])
        for key in ("checkpoint_in_interval", "timings_moved"):
            args[key] = _check.boolean(o, f"state {key}", args[key])
        self._resume(**args)

    def observe(self, iteration: int, loss: float) -> None:
        o = "Scheduler.observe()"
        super().observe(_check.integer(o, "iteration", iteration), _check.number(o, "loss", loss))

    def should_checkpoint(self, iteration: int) -> bool:
        return super().should_checkpoint(_check.integer("Scheduler.should_checkpoint()", "iteration", iteration))

    def step(self, iteration: int, loss: float) -> bool:
        o = "Scheduler.step()"
        return super().step(_check.integer(o, "iteration", iteration), _check.number(o, "loss", loss))

    def report_publish_stall(self, seconds: float) -> None:
        super().report_publish_stall(_check.seconds("Scheduler.report_publish_stall()", "seconds", seconds))

    def report_update_latency(self, seconds: float) -> None:
        super().report_update_latency(_check.seconds("Scheduler.report_update_latency()", "seconds", seconds))

    def evaluate(self, schedule: Any) -> float:
        o = "Scheduler.evaluate()"
        if isinstance(schedule, (str, bytes, Mapping)) or not hasattr(schedule, "__iter__"):
            raise TypeError(f"{o}: schedule={_check.shown(schedule)}: expected a sequence of iterations, "
                            f"got {type(schedule).__name__}")
        return super().evaluate([_check.integer(o, f"schedule[{i}]", x) for i, x in enumerate(schedule)])


for _name in ("observe", "should_checkpoint", "step", "report_publish_stall", "report_update_latency", "evaluate"):
    getattr(Scheduler, _name).__doc__ = getattr(_viper.Scheduler, _name).__doc__


def plan_schedules(losses: Any, *, warmup_end: int, end: int, epoch: int = 0, t_train: float, t_p: float, t_c: float,
                   t_infer: float, requests: int, policies: Any = (), robust_fit: bool = False) -> dict:
    o = "viper.plan_schedules()"
    if isinstance(policies, (str, bytes)) or not hasattr(policies, "__iter__"):
        raise TypeError(f"{o}: policies={_check.shown(policies)}: expected a sequence of policy names, "
                        f"got {type(policies).__name__}")
    names = [_check.text(o, f"policies[{i}]", p) for i, p in enumerate(policies)]
    for p in names:
        if p not in _POLICIES:
            raise InvalidArgumentError(f"{o}: policies={_check.shown(p)}: each must be one of {', '.join(_POLICIES)}")
    return _viper.plan_schedules(
        _losses(o, "losses", losses), warmup_end=_check.integer(o, "warmup_end", warmup_end),
        end=_check.integer(o, "end", end), epoch=_check.integer(o, "epoch", epoch),
        t_train=_check.seconds(o, "t_train", t_train, lo_open=True), t_p=_check.seconds(o, "t_p", t_p),
        t_c=_check.seconds(o, "t_c", t_c), t_infer=_check.seconds(o, "t_infer", t_infer, lo_open=True),
        requests=_check.integer(o, "requests", requests, lo=1), policies=names,
        robust_fit=_check.boolean(o, "robust_fit", robust_fit))


plan_schedules.__doc__ = _viper.plan_schedules.__doc__

Snapshot = _viper.Snapshot
_snapshot_open, _snapshot_from_bytes, _snapshot_save = Snapshot.open, Snapshot.from_bytes, Snapshot.save


def _open(path: Any, verify: bool = True) -> Snapshot:
    return _snapshot_open(_check.path("Snapshot.open()", "path", path), _check.boolean("Snapshot.open()", "verify", verify))


def _from_bytes(data: Any, verify: bool = True) -> Snapshot:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"Snapshot.from_bytes(): data={_check.shown(data)}: expected bytes, got {type(data).__name__}")
    return _snapshot_from_bytes(bytes(data), _check.boolean("Snapshot.from_bytes()", "verify", verify))


def _save(self: Snapshot, path: Any) -> None:
    _snapshot_save(self, _check.path("Snapshot.save()", "path", path))


_open.__doc__, _from_bytes.__doc__, _save.__doc__ = _snapshot_open.__doc__, _snapshot_from_bytes.__doc__, _snapshot_save.__doc__
Snapshot.open, Snapshot.from_bytes, Snapshot.save = staticmethod(_open), staticmethod(_from_bytes), _save


def _check_tensor_names(cls: type, owner: str) -> None:
    """cls[name] takes a str (TypeError naming the key otherwise); `key in cls` is False for a non-str."""
    getitem, contains = cls.__getitem__, cls.__contains__

    def __getitem__(self, name: Any):
        if not isinstance(name, str):
            raise TypeError(f"{owner}[]: name={_check.shown(name)}: expected a str tensor name, got {type(name).__name__}")
        return getitem(self, name)

    def __contains__(self, name: Any) -> bool:
        return isinstance(name, str) and contains(self, name)

    __getitem__.__doc__ = getitem.__doc__
    cls.__getitem__, cls.__contains__ = __getitem__, __contains__


def to_state_dict(version: Any, *, copy: bool = False) -> "collections.OrderedDict":
    """The tensors of `version` (a ModelVersion or a Snapshot) as an OrderedDict name -> torch
    tensor, in data order: what `model.load_state_dict(...)` takes.

    Without copy (the default) every tensor is a view of the version's memory (no copy, a few
    microseconds a tensor): for a subscriber on the node's host that is the node's shared-memory
    segment. Each tensor holds a reference to the version, so the memory stays valid after the
    subscriber moves on to newer versions, for as long as any tensor (or its storage) lives.

    The views are read-only by contract (torch has no read-only tensors): do not write into them
    (in-place ops, an optimizer step on parameters that share them). What a write does depends on
    `version.path`: "map" and "file" versions are mapped read-only and the process dies with
    SIGSEGV; "copy" and "remote" versions sit in a private buffer and the write changes the version
    for every holder in this process (its checksum no longer matches). load_state_dict copies out
    of them (Tensor.copy_), so it is safe; Subscriber.load_into refuses them as targets. copy=True
    returns tensors of their own (one memcpy of the model, writable) instead.

    Dtypes: BF16 comes back as torch.bfloat16 (same bits). F8_E4M3 / F8_E5M2 come back as
    torch.float8_e4m3fn / float8_e5m2 where torch has them (2.1 and later), else as uint8 tensors
    of the raw bits (torch 1.13). U16/U32/U64 need torch's uint16/32/64 (2.3 and later); with an
    older torch they raise TypeError naming the tensor (read them as numpy views: version[name])."""
    if not isinstance(version, (ModelVersion, Snapshot)):
        raise TypeError(f"viper.to_state_dict(): version={_check.shown(version)}: expected a viper.ModelVersion or "
                        f"viper.Snapshot, got {type(version).__name__}")
    return _tensors.to_state_dict(version, copy=_check.boolean("viper.to_state_dict()", "copy", copy))


def _state_dict(self: Any, *, copy: bool = False) -> "collections.OrderedDict":
    return to_state_dict(self, copy=copy)


_state_dict.__doc__ = to_state_dict.__doc__
ModelVersion.state_dict = _state_dict
Snapshot.state_dict = _state_dict

_check_tensor_names(Snapshot, "Snapshot")
_check_tensor_names(ModelVersion, "ModelVersion")
_wait_delta = PublishResult.wait_delta


def _checked_wait_delta(self: PublishResult, timeout: float = 60.0) -> dict:
    return _wait_delta(self, _check.seconds("PublishResult.wait_delta()", "timeout", timeout))


_checked_wait_delta.__doc__ = _wait_delta.__doc__
PublishResult.wait_delta = _checked_wait_delta

__all__ = ["Error", "InvalidArgumentError", "ModelVersion", "Node", "NotFoundError", "PublishResult", "Publisher",
           "Scheduler", "Snapshot", "Subscriber", "ViperIOError", "ViperTimeoutError", "build_snapshot", "log_level",
           "plan_schedules", "set_log_level", "to_state_dict", "__version__"]


# The objects of this process that own threads, sockets or shared memory, still open when it
# exits, are closed by atexit, newest first, before the interpreter finalizes. Left to
# finalization, a thread still inside one of them (a daemon thread, a PipeStore's worker) was
# ended mid-call and the process aborted ("terminate called without an active exception"), a
# C++ thread calling back into Python was ended holding the GIL, and with a daemon thread alive the
# __main__ globals were never cleared, so __del__ never ran and /dev/shm segments stayed. Each
# object registers at the end of its constructor, after the parts it made, so that it is closed
# before them. In a process forked from the one that opened it, an object is forgotten, not
# closed: its threads and locks are the parent's (joining them in the child hung or crashed).
_open_objects: "dict[int, weakref.ref]" = {}
_open_sequence = itertools.count()


def _close_at_exit(obj: Any) -> None:
    """Registers `obj` (which has a close() that may be called more than once) for the above."""
    obj._opened_pid = os.getpid()
    key = next(_open_sequence)
    _open_objects[key] = weakref.ref(obj, lambda _, key=key: _open_objects.pop(key, None))


def _opened_elsewhere(obj: Any) -> bool:
    """True in a process forked from the one that opened `obj`."""
    pid = getattr(obj, "_opened_pid", None)
    return pid is not None and pid != os.getpid()


@atexit.register
def _close_open_objects() -> None:
    for key in sorted(_open_objects, reverse=True):
        ref = _open_objects.get(key)
        obj = ref() if ref is not None else None
        if obj is None or _opened_elsewhere(obj):
            continue
        try:
            obj.close()
        except Exception:  # noqa: BLE001 (an exit handler reports nothing)
            pass


class _Closable:
    """The context-manager protocol and a close() on garbage collection, for a subclass that
    defines close() and lets it be called more than once (later calls do nothing)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


class _Handle(_Closable):
    """A wrapper of one extension object: close() closes it once (in a forked child, forgets it)."""

    _impl: Any = None

    def close(self) -> None:
        impl, self._impl = self._impl, None
        if impl is None:
            return
        if _opened_elsewhere(self):
            impl._abandon()
        else:
            impl.close()

    def _live(self):
        if self._impl is None:
            raise Error(f"{type(self).__name__} is closed")
        return self._impl


_LOG_LEVELS = ("error", "warn", "info", "debug")


def set_log_level(level: str) -> None:
    """Sets the level of Viper's log lines (stderr) in this process: "error", "warn", "info" or
    "debug". Overrides VIPER_LOG (read at the first log line otherwise; default "warn")."""
    if not isinstance(level, str):
        raise TypeError(f"viper.set_log_level(): level={_check.shown(level)}: expected a str, got {type(level).__name__}")
    if level not in _LOG_LEVELS:
        raise InvalidArgumentError(f"viper.set_log_level(): level={_check.shown(level)}: must be one of "
                                   f"{', '.join(_LOG_LEVELS)}")
    _viper._set_log_level(_LOG_LEVELS.index(level))


def log_level() -> str:
    """The current log level ("error", "warn", "info" or "debug")."""
    return _LOG_LEVELS[_viper._log_level()]


# Defaults of the keyword arguments named in the signatures below: read from the C++ options
# structs (their default member initialisers are the one place each default is written);
# tests/python/test_option_defaults.py checks every keyword against them.
_NODE_DEFAULTS = _viper._NodeOptions()
_SUBSCRIBER_DEFAULTS = _viper._SubscriberOptions()


class Node(_Handle):
    """A Viper node on its own (what `viper serve` runs): holds versions in shared memory, serves
    subscribers, keeps the file tier. Publishers embed one; use this for a standalone node."""

    def __init__(self, listen: str = _NODE_DEFAULTS.listen, **options: Any):
        listen = _check.address("viper.Node()", "listen", listen)
        self._impl = _viper._Node(_viper._NodeOptions(listen=listen, **options))
        _close_at_exit(self)

    @property
    def address(self) -> str:
        """"host:port" subscribers connect to."""
        return self._live().address

    def versions(self) -> list:
        """Every version held, as dicts (model, version, size, checksum, step, ..., replicas)."""
        return self._live().versions()

    def latest(self, model: str) -> Optional[dict]:
        """The newest version of `model`, or None."""
        return self._live().latest(_check.model_name("Node.latest()", "model", model))

    def wait_flushed(self, timeout: float = 600.0) -> None:
        """Blocks until every version queued for the file tier is written."""
        self._live().wait_flushed(_check.seconds("Node.wait_flushed()", "timeout", timeout))

    def stats(self) -> dict:
        """The node's counters by name, as `viper stats` prints them (versions_committed,
        notifies_sent, peers, bytes_sent, host_free_segments, delta_*, ...), and its latency
        histograms under "histograms": {"publish_live": ..., "fetch_send": ...}, each
        {"buckets": [(upper bound in seconds, cumulative count), ..., (inf, count)], "count",
        "sum_seconds"}. publish_live: publish() to the version announced here; fetch_send: a
        FETCH served by SEND to its last chunk sent. Buckets: docs/ARCHITECTURE.md "Observability"."""
        return self._live().stats()


class Publisher(_Handle):
    """Publishes versions of one model from a training process; embeds a node listening on `listen`.

    mode="async" (default): publish() copies the tensors into a (recycled) shared-memory segment
    and returns; sealing, announcing and the file-tier copy run in the background. "sync" returns
    when the version is announced. max_in_flight async versions may be queued before publish()
    blocks. cut_through=True (default): a consumer or relay on another host receives a version
    while publish() still copies it (docs/ARCHITECTURE.md "Cut-through from the producer")."""

    def __init__(self, model: str, listen: str = _NODE_DEFAULTS.listen, *, scheduler: Optional[Scheduler] = None,
                 **options: Any):
        model = _check.model_name("viper.Publisher()", "model", model)
        listen = _check.address("viper.Publisher()", "listen", listen)
        if scheduler is not None and not isinstance(scheduler, Scheduler):
            raise TypeError(f"viper.Publisher(): scheduler={_check.shown(scheduler)}: expected a viper.Scheduler, "
                            f"got {type(scheduler).__name__}")
        self._impl = _viper._Publisher(_viper._PublisherOptions(model=model, listen=listen, **options), scheduler)
        _close_at_exit(self)

    def publish(self, tensors: Mapping[str, Any], step: int = 0, loss: Optional[float] = None,
                **metadata: Any) -> PublishResult:
        """Publishes `tensors` (a state_dict() or a dict of numpy arrays) as the next version.
        Extra keyword arguments become string metadata. Returns a PublishResult (version,
        stall_seconds: how long this call blocked training; wait_delta(): the delta the node
        prepares for consumers that fetch over the network). GIL released while copying.

        When every tensor is a CUDA tensor on one device (and no metadata is given), the version
        stays on that GPU: device-to-device copies ordered after torch's current stream (work
        queued on it afterwards waits for them on the device; the call does not wait), consumers
        on this host with Subscriber(device=N) copy it device-to-device, and every other consumer
        gets the same version through host memory once its pinned copy is sealed. Use one kind of
        publish per model (GPU versions are committed to the host tier in the background).
        begin_cuda() is the zero-copy form: the tensors written in place in the version's buffer."""
        owner = "Publisher.publish()"
        _check.mapping(owner, "tensors", tensors)
        step = _check.integer(owner, "step", step)
        loss = _check.optional_number(owner, "loss", loss)
        _check.metadata(owner, metadata)
        on_gpu = None if metadata else _tensors.cuda_entries(tensors)
        if on_gpu is not None:
            device, stream, entries, keep = on_gpu
            result = self._live().publish_device(entries, device, stream, step, loss)
            del keep  # the copies were queued after torch's current stream: its allocator may reuse them
            return result
        entries = _tensors.to_entries(tensors)
        return self._live().publish(entries, step, loss, metadata)

    def begin_cuda(self, tensors: Mapping[str, Any], step: int = 0, loss: Optional[float] = None,
                   device: Any = 0) -> "_tensors.CudaDraft":
        """Zero-copy GPU publish: a version laid out for `tensors` ({name: (shape, dtype)}, dtype a
        torch.dtype or a safetensors name such as "F32", or {name: tensor} for its shape and dtype)
        in one device buffer on `device` (an int, "cuda:N" or a torch.device), to be written in
        place::

            with pub.begin_cuda({"w": ((4096, 4096), torch.bfloat16)}, step=step) as draft:
                draft["w"].copy_(model.w)      # or any kernel writing draft["w"], on torch's stream
            draft.result.version               # committed on leaving the block

        `draft[name]` is a torch CUDA tensor viewing the tensor's place in the buffer (the
        snapshot's layout: the same offsets as the host copy). Leaving the block commits: the
        version is ordered after torch's current stream by an event (the call does not wait for
        the device) and then goes exactly as a GPU publish() (announced when the writes complete,
        consumers with Subscriber(device=N) on this host copy or map it, everyone else gets it
        through host memory). An exception in the block aborts (nothing is announced). Until then
        the buffer is held (not reused); the tensors must not be used after the block.
        Raises viper.InvalidArgumentError / TypeError for a bad spec (on every machine), and
        viper.ViperIOError "Unavailable: GPU: ..." where there is no CUDA driver or GPU."""
        owner = "Publisher.begin_cuda()"
        step = _check.integer(owner, "step", step)
        loss = _check.optional_number(owner, "loss", loss)
        items = _tensors.cuda_specs(owner, tensors)
        ordinal = _tensors.cuda_ordinal(owner, "device", device)
        draft = self._live().begin_device(items, ordinal)
        return _tensors.CudaDraft(self, draft, step, loss)

    def prepare(self, tensors: Mapping[str, Any], **metadata: Any) -> None:
        """Makes the shared-memory segment for versions like `tensors` (e.g. model.state_dict())
        in the background and returns at once, so that the first publish() copies into memory
        already faulted in instead of making it on the training thread (later segments are made
        between publishes anyway). Call it once, before training starts. Nothing is published."""
        owner = "Publisher.prepare()"
        _check.mapping(owner, "tensors", tensors)
        _check.metadata(owner, metadata)
        self._live().prepare(_tensors.to_entries(tensors), metadata)

    def publish_if_due(self, iteration: int, loss: float, tensors: Mapping[str, Any], **metadata: Any):
        """With `scheduler=` (a viper.Scheduler): feeds it (iteration, loss) and publishes when it
        says a checkpoint is due; the tensors are not touched otherwise. Returns the PublishResult,
        or None. The publisher feeds the scheduler the stall of every publish (t_p) and, from the
        subscribers' acknowledgements, the time until a version is live at them (t_c)."""
        owner = "Publisher.publish_if_due()"
        iteration = _check.integer(owner, "iteration", iteration)
        loss = _check.number(owner, "loss", loss)
        _check.mapping(owner, "tensors", tensors)
        if not self._live().due(iteration, loss):
            return None
        return self.publish(tensors, step=iteration, loss=loss, **metadata)

    def wait(self, timeout: float = 600.0) -> None:
        """Blocks until every queued version is announced; raises the first background error."""
        self._live().wait(_check.seconds("Publisher.wait()", "timeout", timeout))

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

    def stats(self) -> dict:
        """The embedded node's stats() (see Node.stats()) plus announced_version and
        last_stall_seconds."""
        return self._live().stats()


class Subscriber(_Handle):
    """Keeps the newest complete version of one model live in a consumer process.

    A loader thread fetches each announced version by the cheapest path (path="auto": map the
    node's segment when on the same host, else copy, UCX, or the file tier), verifies it and swaps
    it in; latest() never returns a torn model. Bytes that crossed the network or came from a file
    are checksum-verified (verify_checksum); bytes of the node's segment on this host are trusted
    unless verify_local=True."""

    def __init__(self, model: str, connect: str = _SUBSCRIBER_DEFAULTS.connect, device: Any = None, **options: Any):
        model = _check.model_name("viper.Subscriber()", "model", model)
        if not (isinstance(connect, str) and connect == "" and options.get("registry")):  # with a registry, connect is unused
            connect = _check.address("viper.Subscriber()", "connect", connect)
        if isinstance(options.get("alternates"), (list, tuple)):  # other types: TypeError from the options
            for i, alternate in enumerate(options["alternates"]):
                _check.address("viper.Subscriber()", f"alternates[{i}]", alternate)
        if device is not None:
            if "gpu_device" in options:
                raise ValueError("viper.Subscriber(): give device= or gpu_device=, not both")
            options["gpu_device"] = _tensors.cuda_ordinal("viper.Subscriber()", "device", device)
        self._impl = _viper._Subscriber(_viper._SubscriberOptions(model=model, connect=connect, **options))
        _close_at_exit(self)

    def latest(self) -> Optional[ModelVersion]:
        """The live version (a read-only mapping of numpy views), or None before the first."""
        return self._live().latest()

    def wait_for(self, version: int = 1, timeout: float = 60.0) -> ModelVersion:
        """Blocks (GIL released) until a version >= `version` is live and returns it; raises
        viper.ViperTimeoutError after `timeout` seconds."""
        version = _check.integer("Subscriber.wait_for()", "version", version)
        timeout = _check.seconds("Subscriber.wait_for()", "timeout", timeout)
        return self._live().wait_for(version, timeout)

    def wait(self, timeout: float = 60.0) -> ModelVersion:
        """Blocks until the next version after the live one is live (the first, if none is)."""
        timeout = _check.seconds("Subscriber.wait()", "timeout", timeout)
        current = self.latest()
        return self.wait_for((current.version if current is not None else 0) + 1, timeout)

    def load_into(self, module: Any, version: Optional[ModelVersion] = None, strict: bool = True) -> ModelVersion:
        """Copies `version` (default: the live one) into a torch module's existing parameters and
        buffers (or a dict of tensors) without reallocating them; returns the version loaded.
        With Subscriber(device=N), tensors on that CUDA device are copied device-to-device from the
        version's GPU copy (torch's current stream, then synchronized); others from host memory.
        With gpu_early=True a version may live on the GPU only (no host bytes: the mapping is
        empty): every target must then be on that device (ValueError otherwise).
        Raises NotFoundError if no version is live yet, ValueError if names or shapes differ or a
        target lies in the memory of a version or snapshot (a state_dict() view, read-only),
        TypeError for a target that is not a torch tensor or a dtype torch cannot load it as (F8
        before torch 2.1 loads only into uint8: its raw bits). Nothing is copied unless every
        target passes."""
        owner = "Subscriber.load_into()"
        if not (hasattr(module, "state_dict") or isinstance(module, Mapping)):
            raise TypeError(f"{owner}: module={_check.shown(module)}: expected a torch module or a mapping name -> "
                            f"tensor, got {type(module).__name__}")
        if version is not None and not isinstance(version, ModelVersion):
            raise TypeError(f"{owner}: version={_check.shown(version)}: expected a viper.ModelVersion or None, "
                            f"got {type(version).__name__}")
        _check.boolean(owner, "strict", strict)
        if version is None:
            version = self.latest()
            if version is None:
                raise NotFoundError("load_into: no version is live yet (use wait_for first)")
        _tensors.copy_into_module(version, module, strict=strict)
        return version

    def ack(self, version: int) -> None:
        """With ack_on_live=False: tells the producer's node that `version` is now served here (a
        Publisher with a Scheduler measures t_c up to this ACK)."""
        self._live().ack(_check.integer("Subscriber.ack()", "version", version, lo=1))

    def stats(self) -> dict:
        """notifies, updates, skipped, fetch_failures, deltas (versions that came as a delta),
        delta_fallbacks (deltas that failed and were fetched in full), connect_failures,
        preferred_returns, liveness_failures (connections given up because the node did not
        answer a probe: its host vanished or the network was cut), segments_mapped and segments_reused (map and copy paths: node segments
        mapped here, and fetches that found theirs mapped already by an earlier version)."""
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
    owner = "viper.build_snapshot()"
    _check.mapping(owner, "tensors", tensors)
    model = _check.model_name(owner, "model", model, allow_empty=True)
    version = _check.integer(owner, "version", version)
    step = _check.integer(owner, "step", step)
    loss = _check.optional_number(owner, "loss", loss)
    alignment = _check.integer(owner, "alignment", alignment, lo=1, hi=1 << 20)
    _check.metadata(owner, metadata)
    return Snapshot._build(_tensors.to_entries(tensors), model, version, step, loss, metadata, alignment)
