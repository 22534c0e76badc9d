"""viper.neardata: near-data processing (NDPipe). Storage hosts run the work that touches every
stored sample and send back only small results; the compute side gets labels and features, the
storage side gets model versions as deltas.

    import viper.neardata as nd

    # on each storage host: relabel the local shard on every new version of "clf"
    store = nd.PipeStore("clf", "mymodels:build", "/data/shard3.rec", "/data/labels.db",
                         connect="10.0.0.1:7700", name="s3", features_listen="10.0.0.3:7801")
    store.stats()        # version, done, total, samples_per_s, passes, ...

    # on the compute host: fine-tune the trainable layers from the stores' features (FT-DMP)
    tuner = nd.Tuner("clf", "mymodels:build", stores={"s3": "10.0.0.3:7801", ...}, listen="10.0.0.1:7700")
    report = tuner.finetune(epochs=2, chunks=8, pipelined=True)   # busy_fraction, rounds, ...

The factory ("MODULE:FUNCTION" or a callable) builds the torch module; versions are copied into
it with Subscriber.load_into. For fine-tuning the module has two children: `backbone` (frozen,
run at the stores) and `head` (trainable, owned by the Tuner); forward(x) = head(backbone(x)).
A store's transform turns a batch of raw records (uint8 [B, nbytes]) into the module's input
(default: a float32 view); the label is the argmax of the output and the score its softmax
probability unless a postprocess(output) -> (labels, scores) is given.

Command line (python3 -m viper.neardata --help): serve, labels, fileserver, bench.
"""
from __future__ import annotations

if __name__ == "__main__":  # the command line, before torch is imported (`labels` never needs it)
    import sys

    from viper._neardata_cli import main
    sys.exit(main())

import collections
import importlib
import os
import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from . import InvalidArgumentError, Publisher, Subscriber, ViperTimeoutError as ViperTimeout
from . import _Closable, _close_at_exit
from . import data as _data
from ._labeldb import LabelDB, check_label_db

__all__ = ["LabelDB", "PipeStore", "Tuner", "default_transform", "load_callable", "softmax_postprocess"]

FEATURES_STREAM = "{model}.features.{store}"


def load_callable(spec, what: str = "factory") -> Callable:
    """A callable, or "MODULE:FUNCTION" imported (e.g. "mymodels:build")."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise InvalidArgumentError(f"{what} {spec!r} must be MODULE:FUNCTION (e.g. mymodels:build)")
    module_name, function = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InvalidArgumentError(f"{what} {spec!r}: cannot import module {module_name!r}: {e}") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise InvalidArgumentError(f"{what} {spec!r}: module {module_name!r} has no function {function!r}")
    return fn


def default_transform(batch: np.ndarray) -> torch.Tensor:
    """uint8 [B, nbytes] -> float32 [B, nbytes / 4], a view (no copy)."""
    return torch.from_numpy(batch).view(torch.float32)


def softmax_postprocess(output: torch.Tensor):
    """(argmax labels, their softmax probabilities) as numpy arrays."""
    probs = torch.softmax(output.float(), dim=1)
    scores, labels = probs.max(dim=1)
    return labels.numpy(), scores.numpy()


def _ft_job(version) -> Optional[dict]:
    """The fine-tuning job a Tuner's version announces (its metadata), or None."""
    meta = version.metadata
    if "ft_job" not in meta:
        return None
    return {"job": meta["ft_job"], "round": int(meta["ft_round"]), "taken": int(meta["ft_taken"]),
            "rounds": int(meta["ft_rounds"]), "chunks": int(meta["ft_chunks"]), "depth": int(meta["ft_depth"])}


class PipeStore(_Closable):
    """A storage host's worker. Subscribes to `model` like any consumer (deltas over the network)
    and, on every new version, relabels its shard `data` (a record file or directory, read through
    viper.data's prefetcher) into the label database `labels`. A version that arrives mid-pass is
    taken at the next batch boundary; the samples labelled by the older one are redone after.
    Restarted on the same database it resumes: only samples without a label of the newest version
    are read. When a Tuner's version announces a fine-tuning job, it runs the frozen layers on its
    chunks and publishes the features as `<model>.features.<name>` (needs features_listen).
    `token`: the shared secret of the model's node, also required of the Tuner by the features
    node (a node listening beyond loopback needs one, unless insecure=True).

    Thread-safety: stats() and close() may be called from any thread; the work runs on one
    background thread started by the constructor."""

    def __init__(self, model: str, factory, data, labels, *, connect: Optional[str] = None,
                 registry: Optional[str] = None, transform=None, postprocess=None, batch_size: int = 256,
                 ids: Optional[Sequence[int]] = None, name: str = "store", features_listen: Optional[str] = None,
                 on_event: Optional[Callable[[dict], None]] = None, readers: int = 2, token: str = "",
                 insecure: bool = False, **subscriber_options: Any):
        if (connect is None) == (registry is None):
            raise InvalidArgumentError("PipeStore: give exactly one of connect=HOST:PORT and registry=URL")
        if batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.name, self.batch_size = model, name, int(batch_size)
        self._module = load_callable(factory)()
        if not isinstance(self._module, torch.nn.Module):
            raise InvalidArgumentError(f"factory {factory!r} returned a {type(self._module).__name__}, not a "
                                       "torch.nn.Module")
        self._module.eval()
        self._transform = load_callable(transform, "transform") if transform is not None else default_transform
        self._post = load_callable(postprocess, "postprocess") if postprocess is not None else softmax_postprocess
        self._source = _data.open_source(data)
        self._ids = [int(i) for i in (ids if ids is not None else range(len(self._source)))]
        if len(set(self._ids)) != len(self._ids):
            twice = next(i for i, n in collections.Counter(self._ids).items() if n > 1)
            raise InvalidArgumentError(f"PipeStore: ids: sample {twice} is listed twice (a sample has one label)")
        self._readers = int(readers)
        self._on_event = on_event
        self._features_pub: Optional[Publisher] = None
        self._sub: Optional[Subscriber] = None
        options = dict(subscriber_options, token=token)
        if registry is not None:
            options["registry"] = registry
        # The label database checked first (read-only: a foreign or another model's file is named
        # before anything starts) and opened last: a run refused for another argument leaves it as
        # it was (its first use stamps it with the model).
        # What this store labels, as the database records it: a database of another shard (same
        # model) would otherwise pass its labels off as this one's.
        shard = None if isinstance(data, _data.Source) else f"{os.path.realpath(data)} ({len(self._source)} samples)"
        check_label_db(labels, model, shard)
        try:
            if features_listen is not None:  # up from the start: a Tuner may subscribe before any job
                self._features_pub = Publisher(FEATURES_STREAM.format(model=model, store=name),
                                               listen=features_listen, mode="sync", delta="off", token=token,
                                               insecure=insecure)
            self._sub = Subscriber(model, connect=connect or "", **options)
            self._db = LabelDB(labels, model=model, shard=shard)
        except BaseException:
            for opened in (self._sub, self._features_pub):
                if opened is not None:
                    opened.close()
            raise
        self._jobs_done: set = set()
        self._lock = threading.Lock()
        self._stats = {"version": 0, "done": self._db.count(), "total": len(self._ids), "samples_per_s": 0.0,
                       "passes": 0, "batches": 0, "samples": 0, "bytes_read": 0, "switches": 0, "feature_rounds": 0,
                       "feature_bytes": 0, "state": "waiting", "error": None}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"pipestore-{name}", daemon=True)
        self._thread.start()
        _close_at_exit(self)

    # -- public ----------------------------------------------------------------------------------

    def stats(self) -> dict:
        """version (the one labelling now), done/total (samples labelled by it), samples_per_s (this
        pass), passes, batches, samples, bytes_read, switches (versions taken mid-pass), state
        (waiting, relabelling, features, failed), error, feature_rounds/feature_bytes (FT-DMP),
        wire_bytes (bytes received for the versions it used: deltas or snapshots), subscriber
        (Subscriber.stats())."""
        with self._lock:
            out = dict(self._stats)
        sub = self._sub.stats()
        out["subscriber"] = sub
        out["wire_bytes"] = self._wire_bytes
        return out

    @property
    def features_address(self) -> Optional[str]:
        """"host:port" the Tuner subscribes to for this store's features (None without features_listen)."""
        return self._features_pub.address if self._features_pub is not None else None

    def wait_refreshed(self, version: int, timeout: float = 60.0) -> dict:
        """Blocks until every sample has a label of `version` or newer; returns stats()."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.stats()
            if s["error"]:
                raise RuntimeError(f"PipeStore {self.name}: {s['error']}")
            if s["version"] >= version and s["done"] == s["total"] and s["state"] == "waiting":
                return s
            time.sleep(0.02)
        raise ViperTimeout(f"PipeStore {self.name}: labels not refreshed to version {version} in {timeout} s "
                           f"({self.stats()})")

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for handle in (self._sub, self._features_pub):
            if handle is not None:
                handle.close()
        self._db.close()

    # -- the worker ------------------------------------------------------------------------------

    _wire_bytes = 0
    _last_wire_version = 0
    _clean_version = -1  # every sample has a label of this version

    def _emit(self, event: str, **fields) -> None:
        if self._on_event is not None:
            self._on_event(dict(fields, event=event, store=self.name, time=time.time()))

    def _set(self, **fields) -> None:
        with self._lock:
            self._stats.update(fields)

    def _latest(self, after: int = 0, timeout: float = 0.2):
        """The live version once it is newer than `after` (waits up to `timeout`), else the live one."""
        try:
            v = self._sub.wait_for(after + 1, timeout=timeout)
        except ViperTimeout:
            v = self._sub.latest()
        return self._seen(v)

    def _seen(self, v):
        """Counts the bytes that brought `v` (once per version this store looks at)."""
        if v is not None and v.version > self._last_wire_version:
            self._last_wire_version = v.version
            self._wire_bytes += v.wire_bytes
        return v

    def _main(self) -> None:
        try:
            current = None
            while not self._stop.is_set():
                v = self._latest(current.version if current is not None else 0)
                if v is None:
                    continue
                if current is None or v.version != current.version:
                    current = v
                    self._db.note_version(v.version, v.timings["publish_ns"])
                job = self._active_job(v)
                if job is not None:
                    self._features(job)
                    current = None
                    continue
                if v.version == self._clean_version:
                    continue
                todo = self._db.ids_not_at(v.version, self._ids)
                if todo:
                    self._relabel(v, todo)
                    current = None  # look again: a newer version may have come meanwhile
                else:
                    self._clean_version = v.version
                    self._set(version=v.version, done=len(self._ids), state="waiting")
        except Exception as e:  # noqa: BLE001 (reported through stats() and the command's exit code)
            self._set(state="failed", error=f"{type(e).__name__}: {e}")
            self._emit("failed", error=f"{type(e).__name__}: {e}")

    def _active_job(self, version) -> Optional[dict]:
        """The fine-tuning job `version` announces, if this store has not served it and it goes on."""
        job = _ft_job(version)
        if job is None or job["job"] in self._jobs_done or job["round"] >= job["rounds"] - 1:
            return None
        return job

    def _relabel(self, version, todo: list) -> None:
        self._sub.load_into(self._module, version)
        loaded = version.version
        done = len(self._ids) - len(todo)
        started = time.monotonic()
        publish_ns = version.timings["publish_ns"]
        self._set(version=loaded, done=done, state="relabelling", samples_per_s=0.0)
        self._emit("version", version=loaded, done=done, total=len(self._ids), delta_base=version.delta_base,
                   wire_bytes=version.wire_bytes, path=version.path)
        pass_samples, last_report = 0, started
        prefetcher = _data.Prefetcher(self._source, ids=todo, epochs=1, shuffle=False, readers=self._readers)
        try:
            while not self._stop.is_set():
                batch = prefetcher.next_batch(self.batch_size)
                if batch is None:
                    break
                newest = self._seen(self._sub.latest())
                if newest is not None and newest.version > loaded and self._active_job(newest) is not None:
                    break  # a fine-tuning job comes first; the labels follow with its final version
                if newest is not None and newest.version > loaded:  # the batch boundary: take it now
                    self._sub.load_into(self._module, newest)
                    self._db.note_version(newest.version, newest.timings["publish_ns"])
                    loaded, done, publish_ns = newest.version, self._db.count(newest.version), newest.timings["publish_ns"]
                    with self._lock:
                        self._stats["switches"] += 1
                    self._emit("version", version=loaded, done=done, total=len(self._ids), mid_pass=True,
                               delta_base=newest.delta_base, wire_bytes=newest.wire_bytes, path=newest.path)
                raw, _, ids = batch
                with torch.no_grad():
                    out = self._module(self._transform(raw))
                labels, scores = (np.asarray(a) for a in self._post(out))
                if labels.shape != ids.shape or scores.shape != ids.shape:
                    raise ValueError(f"postprocess returned labels of shape {labels.shape} and scores of shape "
                                     f"{scores.shape} for a batch of {len(ids)} samples: one label and one score "
                                     "per sample")
                self._db.write_batch(ids.tolist(), labels.tolist(), scores.tolist(), loaded)
                pass_samples += len(ids)
                done += len(ids)
                now = time.monotonic()
                with self._lock:
                    s = self._stats
                    s.update(version=loaded, done=done, samples_per_s=pass_samples / max(now - started, 1e-9))
                    s["batches"] += 1
                    s["samples"] += len(ids)
                    s["bytes_read"] += int(raw.nbytes)
                if now - last_report >= 1.0:
                    last_report = now
                    self._emit("progress", version=loaded, done=done, total=len(self._ids),
                               samples_per_s=round(pass_samples / (now - started), 1))
        finally:
            prefetcher.close()
        if done >= len(self._ids) and not self._stop.is_set():
            with self._lock:
                self._stats["passes"] += 1
                self._stats["state"] = "waiting"
            elapsed = time.monotonic() - started
            self._emit("refreshed", version=loaded, total=len(self._ids), pass_seconds=round(elapsed, 4),
                       since_publish_seconds=round(time.time() - publish_ns / 1e9, 4),
                       samples_per_s=round(pass_samples / max(elapsed, 1e-9), 1))

    # -- FT-DMP: the frozen layers' forward pass, features to the Tuner -------------------------------

    def _wait_round(self, job: dict, key: str, at_least: int) -> bool:
        """Waits until the Tuner's newest version of `job` has `key` ("round": trained, "taken")
        >= at_least; False if the job is no longer announced or the store stops."""
        while not self._stop.is_set():
            v = self._seen(self._sub.latest())
            j = _ft_job(v) if v is not None else None
            if j is None or j["job"] != job["job"]:
                return False
            if j[key] >= at_least:
                return True
            self._latest(v.version, timeout=0.2)
        return False

    def _features(self, job: dict) -> None:
        if self._features_pub is None:
            raise InvalidArgumentError(f"PipeStore {self.name}: a Tuner announced fine-tuning job {job['job']} but this "
                                       "store has no features_listen address")
        chunks = np.array_split(np.asarray(self._ids, dtype=np.int64), job["chunks"])
        self._set(state="features")
        self._emit("finetune", job=job["job"], rounds=job["rounds"], depth=job["depth"])
        for k in range(job["rounds"]):
            t0, c0 = time.time(), time.process_time()
            # Extract round k once the Tuner has trained round k-1-depth (pipelined, depth 2: right
            # after publishing round k-1, while the Tuner trains round k-2) ...
            if not self._wait_round(job, "round", k - 1 - job["depth"]):
                break
            t1, c1 = time.time(), time.process_time()
            held = self._seen(self._sub.latest())
            self._sub.load_into(self._module, held)
            held = _ft_job(held)
            x, y, ids = self._extract(chunks[k % job["chunks"]])
            t2, c2 = time.time(), time.process_time()
            # ... and publish it once the Tuner holds round k-1 (this version replaces that one).
            if not self._wait_round(job, "taken", k - 1):
                break
            t3 = time.time()
            result = self._features_pub.publish({"x": x, "y": y, "ids": ids}, step=k, ft_job=job["job"],
                                                ft_round=str(k))
            t4 = time.time()
            with self._lock:
                self._stats["feature_rounds"] += 1
                self._stats["feature_bytes"] += int(result.bytes)
            self._emit("features", job=job["job"], round=k, samples=len(ids),
                       held_round=held["round"] if held is not None and held["job"] == job["job"] else None,
                       wait_seconds=round(t1 - t0, 4),
                       extract_seconds=round(t2 - t1, 4), hold_seconds=round(t3 - t2, 4),
                       publish_seconds=round(t4 - t3, 4), extract_cpu_seconds=round(c2 - c1, 4),
                       cpu_seconds=round(time.process_time() - c0, 4))
        self._jobs_done.add(job["job"])
        self._set(state="waiting")

    def _extract(self, ids: np.ndarray):
        if len(ids) == 0:  # a round beyond this store's samples (more chunks than samples): none
            x_shape, x_dtype = self._feature_layout
            return np.empty((0, *x_shape), x_dtype), np.empty(0, np.int64), np.empty(0, np.int64)
        xs, ys, order = [], [], []
        prefetcher = _data.Prefetcher(self._source, ids=ids.tolist(), epochs=1, shuffle=False, readers=self._readers)
        try:
            while True:
                batch = prefetcher.next_batch(self.batch_size)
                if batch is None:
                    break
                raw, labels, got = batch
                with torch.no_grad():
                    xs.append(self._module.backbone(self._transform(raw)).float().numpy())
                ys.append(labels.astype(np.int64))
                order.append(got.astype(np.int64))
                with self._lock:
                    self._stats["bytes_read"] += int(raw.nbytes)
        finally:
            prefetcher.close()
        x = np.concatenate(xs)
        self._feature_layout = (x.shape[1:], x.dtype)  # round 0's chunk is never empty (array_split)
        return x, np.concatenate(ys), np.concatenate(order)


from ._tuner import Tuner  # noqa: E402 (the Tuner uses the names above)
