"""viper.data: the training-data side. Auto-tuned parallel prefetching and a rehearsal buffer.

    import viper.data as vd

    # a directory tree (one sample per file, labels from the top-level subdirectories) or a record file
    loader = vd.DataLoader("/data/train", batch_size=64,
                           batch_transform=lambda x: x.view(torch.float32).reshape(-1, 3, 32, 32))
    for epoch in range(10):
        for x, y in loader:                  # x: the batch, y: int64 labels (torch tensors)
            ...
    print(loader.stats())                    # readers, buffer, consumer wait, the tuner's moves

    # or as a torch IterableDataset (batching by torch's DataLoader with num_workers=0)
    ds = vd.PrefetchDataset("/data/train", transform=lambda a, label: (decode(a), label))
    torch.utils.data.DataLoader(ds, batch_size=64)

    # rehearsal against forgetting: mix old samples into each new batch
    buf = vd.RehearsalBuffer(2000, sample_shape=(1, 512), dtype="float32", ratio=0.5,
                             policy="class_balanced", spill_dir="/pfs/job/rehearsal")
    x_mixed, y_mixed = buf.mix(x, y)         # x plus 0.5 * len(x) old samples; then x joins the buffer
    buf.spill()                              # survives a restart (restored when opened again)

Data-parallel ranks share one epoch and one collaborative cache across their nodes: each epoch's
global shuffle (by `seed`) is dealt out across the ranks, and after its first read each sample is
kept in the memory of one owner node, from which the other ranks take it over UCX instead of
reading the source again:

    loader = vd.DataLoader("/pfs/train", batch_size=64, rank=r, world_size=n, seed=0,
                           cache_nodes=["10.0.0.1:7500", "10.0.0.2:7500", ...], cache_token=token)
    loader.stats()["source_bytes"], loader.stats()["epoch_samples"], loader.stats()["cache"]

    # one rehearsal buffer over the ranks: capacity spread over their shards, draws from all of them
    buf = vd.DistributedRehearsalBuffer(4000, cache=loader.cache, sample_shape=(1, 512), ratio=0.5)
    x_mixed, y_mixed = buf.mix(x, y)

The processes of one host (ranks, or the jobs of a hyper-parameter search on one data set) can
share one data service: one cache in shared memory and one set of readers, each process receiving
its samples mapped from that memory, each job within a reader and memory budget changed at run
time (`viper data set-budget`, or ServiceControl):

    svc = vd.DataService("/pfs/train", "127.0.0.1:7600")      # or: python3 -m viper.data_service serve
    loader = vd.DataLoader(None, batch_size=64, seed=3, service="127.0.0.1:7600", service_job="lr-0.1")
    vd.ServiceControl("127.0.0.1:7600").set_budget("lr-0.1", readers=2, memory=64 << 20)

Sample bytes reach Python without a copy: each sample is a uint8 numpy array over the prefetcher's
own buffer (torch.from_numpy shares it); a stacked batch costs one memcpy per sample, made in C++
without the GIL. The reader threads, the buffer and the tuner are C++ (include/viper/prefetch.h);
options are keyword arguments with the C++ names and defaults (listed in each class's docstring).
Errors raise viper.Error subclasses: a bad sample is viper.InvalidArgumentError (a ValueError)
naming it, unless on_error="skip" (then it is skipped and counted in stats()).
"""
from __future__ import annotations

import math
import numbers
import os
import textwrap
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Tuple

import numpy as np

from . import _Closable, _Handle, _close_at_exit, _opened_elsewhere, _viper
from . import _checks as _check


def _ids(owner: str, ids: Any) -> Optional[list]:
    """`ids` as a list of sample ids (ints >= 0), or None (every sample). An empty list is refused:
    it selects no samples (the C++ prefetcher reads every sample for an empty list)."""
    if ids is None:
        return None
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"{owner}: ids={_check.shown(ids)}: expected a sequence of sample ids, got {type(ids).__name__}")
    out = [_check.integer(owner, f"ids[{i}]", v) for i, v in enumerate(ids)]
    if not out:
        raise _viper.InvalidArgumentError(f"{owner}: ids=[] selects no samples (ids=None reads every sample)")
    return out


def _callable(owner: str, name: str, value: Any) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{owner}: {name}={_check.shown(value)}: expected a callable or None, got {type(value).__name__}")

try:  # torch is optional: the Prefetcher and RehearsalBuffer work on numpy alone
    import torch
    import torch.utils.data as _torch_data
except ImportError:  # pragma: no cover (Debian's torch is installed where the tests run)
    torch = None
    _torch_data = None

__all__ = ["DataLoader", "DistributedRehearsalBuffer", "PrefetchDataset", "Prefetcher", "RehearsalBuffer",
           "SampleCache", "Source", "callable_source", "open_source", "sample_owner", "write_records"]


class Source:
    """A fixed list of samples: a directory tree of files or the records of a record file.
    Picklable (it reopens by path), so it can travel to DataLoader worker processes."""

    def __init__(self, impl, reopen: tuple):
        self._impl = impl
        self._reopen = reopen

    def __reduce__(self):
        if self._reopen is None:
            raise TypeError("a callable_source cannot be pickled")
        path, extensions, options = self._reopen
        return (_reopen_source, (path, extensions, options))

    def __len__(self) -> int:
        return len(self._impl)

    def _id(self, owner: str, sample_id: Any) -> int:
        """An index into the samples: TypeError if not an int, IndexError if out of range."""
        return _check.index(owner, "sample_id", sample_id, len(self._impl))

    def nbytes(self, sample_id: int) -> int:
        """Size of sample `sample_id` in bytes."""
        return self._impl.bytes(self._id("Source.nbytes()", sample_id))

    def label(self, sample_id: int) -> int:
        """Label of sample `sample_id` (-1: none)."""
        return self._impl.label(self._id("Source.label()", sample_id))

    def describe(self, sample_id: int) -> str:
        """How errors name the sample: "sample 17 (/data/cat/0017.bin)"."""
        return self._impl.describe(self._id("Source.describe()", sample_id))

    def read(self, sample_id: int) -> np.ndarray:
        """Reads one sample now (uint8 array; GIL released while reading)."""
        return self._impl.read(self._id("Source.read()", sample_id))

    @property
    def class_names(self) -> list:
        """Class names by label (a directory tree: its top-level subdirectories)."""
        return self._impl.class_names


def open_source(path, *, extensions: Sequence[str] = (), **options) -> Source:
    """A directory (every regular file below it is a sample, sorted by path; labels from the
    top-level subdirectories) or a record file (viper.data.write_records). Keyword options of a
    directory source: labels_from_subdirs, sample_bytes, max_sample_bytes, skip_hidden, and
    `extensions` (e.g. [".bin"])."""
    path = _check.path("viper.data.open_source()", "path", path)
    if isinstance(extensions, (str, bytes)) or not hasattr(extensions, "__iter__"):
        raise TypeError(f"viper.data.open_source(): extensions={_check.shown(extensions)}: expected a sequence of str, "
                        f"got {type(extensions).__name__}")
    extensions = [_check.text("viper.data.open_source()", f"extensions[{i}]", e) for i, e in enumerate(extensions)]
    if os.path.isdir(path):
        impl = _viper._open_directory(_viper._DirectorySourceOptions(dir=path, **options), list(extensions))
    else:
        if options or extensions:
            raise TypeError(f"open_source({path!r}): options {sorted(options) + (['extensions'] if extensions else [])} "
                            "apply to a directory, not a record file")
        impl = _viper._open_records(path)
    return Source(impl, (path, tuple(extensions), dict(options)))


def _reopen_source(path, extensions, options) -> Source:
    return open_source(path, extensions=extensions, **options)


def _as_source(source) -> Source:
    return source if isinstance(source, Source) else open_source(source)


def callable_source(read: Callable[[int], Any], nbytes: Sequence[int], labels: Optional[Sequence[int]] = None,
                    name: str = "callable") -> Source:
    """A Source whose samples come from read(sample_id) -> bytes (or any buffer) of nbytes[sample_id]
    bytes, e.g. an HTTP GET from a file server. The reader threads call it holding the GIL (a
    blocking socket read releases it). Not picklable."""
    owner = "viper.data.callable_source()"
    _callable(owner, "read", read)
    if read is None:
        raise TypeError(f"{owner}: read=None: expected a callable")
    if isinstance(nbytes, (str, bytes)) or not hasattr(nbytes, "__iter__"):
        raise TypeError(f"{owner}: nbytes={_check.shown(nbytes)}: expected a sequence of sizes")
    sizes = [_check.integer(owner, f"nbytes[{i}]", v, lo=0) for i, v in enumerate(nbytes)]
    if not sizes:
        raise _viper.InvalidArgumentError(f"{owner}: nbytes=[]: a source needs at least one sample")
    labs = [] if labels is None else [_check.integer(owner, f"labels[{i}]", v, lo=-1) for i, v in enumerate(labels)]
    impl = _viper._callable_source(read, sizes, labs, _check.text(owner, "name", name))
    src = Source(impl, None)
    return src


def sample_owner(sample_id: int, nodes: Sequence[str]) -> int:
    """The index in `nodes` of the cache node that owns sample `sample_id` (rendezvous hashing:
    the same on every rank, whatever the order of `nodes`; a node joining or leaving moves only
    the samples it gains or held)."""
    owner = "viper.data.sample_owner()"
    sample_id = _check.integer(owner, "sample_id", sample_id)
    nodes = _nodes(owner, nodes)
    return _viper._sample_owner(sample_id, nodes)


def _nodes(owner: str, nodes: Any) -> list:
    if isinstance(nodes, (str, bytes)) or not hasattr(nodes, "__iter__"):
        raise TypeError(f"{owner}: nodes={_check.shown(nodes)}: expected a sequence of 'HOST:PORT' strings, "
                        f"got {type(nodes).__name__}")
    nodes = [_check.text(owner, f"nodes[{i}]", n) for i, n in enumerate(nodes)]
    if not nodes:
        raise _viper.InvalidArgumentError(f"{owner}: nodes=[]: list every cache node's 'HOST:PORT'")
    return nodes


class SampleCache(Source):
    """A collaborative cache of `source`'s samples across the nodes of data-parallel ranks, itself
    a Source (give it to a Prefetcher, or let DataLoader(cache_nodes=...) make one).

    `nodes` is the membership, every node's "HOST:PORT", the same list on every rank; this process
    starts the node nodes[node] (its shared memory holds the samples this node owns). A read takes
    the sample from this node, else from its owner's node over UCX, else from the source, and
    then puts it into the owner's node. An unreachable node is left out for `retry_down` seconds
    (its samples go to their next owner). `token` is the nodes' shared secret (required beyond
    loopback unless insecure=True); max_bytes the node's memory budget (0: half of /dev/shm);
    max_samples the samples it may hold (0: as many as vm.max_map_count allows, one mapping each:
    49,146 on a default kernel; more is refused); `name` the cache's namespace in the nodes
    ([A-Za-z0-9_-], default "data").

    start_node=False attaches to nodes[node] instead of starting it: the node is run by another
    process on this host (another rank's or job's SampleCache, or `viper serve`), so that several
    processes on one host share one cache in one node's shared memory."""

    def __init__(self, source, nodes: Sequence[str], node: int = 0, *, name: str = "data", token: str = "",
                 insecure: bool = False, max_bytes: int = 0, max_samples: int = 0, timeout: float = 10.0,
                 retry_down: float = 3.0, start_node: bool = True):
        owner = "viper.data.SampleCache()"
        nodes = _nodes(owner, nodes)
        node = _check.integer(owner, "node", node, lo=0, hi=len(nodes) - 1)
        name = _check.text(owner, "name", name)
        token = _check.text(owner, "token", token, allow_empty=True)
        insecure = _check.boolean(owner, "insecure", insecure)
        max_bytes = _check.integer(owner, "max_bytes", max_bytes, lo=0)
        max_samples = _check.integer(owner, "max_samples", max_samples, lo=0)
        timeout = _check.number(owner, "timeout", timeout, lo=0.001)
        retry_down = _check.number(owner, "retry_down", retry_down, lo=0.0)
        start_node = _check.boolean(owner, "start_node", start_node)
        base = _as_source(source)
        self._cache = _viper._SampleCache(base._impl, nodes, node, name, token, insecure, max_bytes, max_samples,
                                          timeout, retry_down, start_node)
        self.base = base
        self.nodes = nodes
        self.node = node
        self.start_node = start_node
        super().__init__(self._cache.source, base._reopen)
        _close_at_exit(self)

    def __reduce__(self):
        raise TypeError("a SampleCache owns a node in this process and cannot be pickled; give workers the Source")

    @property
    def address(self) -> str:
        """This node's address, as it listens."""
        return self._cache.address

    def owner(self, sample_id: int) -> int:
        """The owner node (index in nodes) of a sample as this rank sees the membership now."""
        return self._cache.owner(self._id("SampleCache.owner()", sample_id))

    def stats(self) -> dict:
        """source_reads, source_bytes (read from the source since the cache started), local_hits,
        local_bytes (from this node), remote_hits, remote_bytes (from other nodes), misses, puts,
        put_bytes, put_failures, peer_failures, node_samples and node_bytes (what this node holds
        now), down (nodes left out as unreachable)."""
        return self._cache.stats()

    def close(self) -> None:
        """Drops this handle's hold on the node (it stops, and its shared memory goes, once no
        prefetcher reads through it). The Source part then reads `base` directly. In a process
        forked from the one that opened it, only forgets the node (its threads are the parent's)."""
        self._impl = self.base._impl  # the cache as a Source holds the node too
        if _opened_elsewhere(self):
            self._cache._abandon()
        else:
            self._cache.close()


def write_records(path, samples: Iterable[Tuple[Any, int]], metadata: bytes = b"") -> int:
    """Writes a record file atomically (a temporary file, fsync, rename) from (buffer, label)
    pairs (bytes, numpy arrays; label -1 for none). Returns the number of records."""
    owner = "viper.data.write_records()"
    path = _check.path(owner, "path", path)
    if not hasattr(samples, "__iter__") or isinstance(samples, (str, bytes)):
        raise TypeError(f"{owner}: samples={_check.shown(samples)}: expected an iterable of (buffer, label) pairs, "
                        f"got {type(samples).__name__}")
    if not isinstance(metadata, (bytes, bytearray)):
        raise TypeError(f"{owner}: metadata={_check.shown(metadata)}: expected bytes, got {type(metadata).__name__}")
    writer = _viper._RecordWriter(path)
    for i, sample in enumerate(samples):
        if not isinstance(sample, (tuple, list)) or len(sample) != 2:
            raise TypeError(f"{owner}: samples[{i}]={_check.shown(sample)}: expected a (buffer, label) pair")
        data, label = sample
        if data is None or isinstance(data, (str, Mapping)):
            raise TypeError(f"{owner}: samples[{i}] buffer={_check.shown(data)}: expected bytes or a numpy array, "
                            f"got {type(data).__name__}")
        label = _check.integer(owner, f"samples[{i}] label", label, lo=-1)
        writer.append(np.ascontiguousarray(data), label)
    writer.finish(bytes(metadata))
    return writer.records


class Prefetcher(_Handle):
    """Reads the samples of `source` (a path or a Source) with reader threads into a bounded
    buffer, one shuffled epoch after another; the tuner moves the readers and the buffer online.

    Iterating gives one epoch of (array, label, sample_id) tuples; iterate again for the next one.
    `ids` restricts it to some samples (e.g. a shard)."""

    def __init__(self, source, *, ids: Optional[Sequence[int]] = None, **options):
        ids = _ids("viper.data.Prefetcher()", ids)
        prefetch_options = _viper._PrefetchOptions(**options)  # checked before the source is opened
        self.source = _as_source(source)
        self._impl = _viper._Prefetcher(self.source._impl, prefetch_options, ids or [])
        _close_at_exit(self)

    def close(self) -> None:
        """Stops and joins the readers. In a process forked from the one that opened it (a
        DataLoader worker), only forgets it: the threads are the parent's."""
        super().close()

    def __iter__(self) -> Iterator[Tuple[np.ndarray, int, int]]:
        while True:
            sample = self._live().next()
            if sample is None:
                return
            yield sample

    def next(self, timeout: Optional[float] = None):
        """The next (array, label, sample_id) of the epoch, or None at its end (the next call
        begins the next epoch) and after the last epoch. Raises viper.ViperTimeoutError after
        `timeout` seconds without a sample."""
        return self._live().next(_check.optional_seconds("Prefetcher.next()", "timeout", timeout))

    def next_batch(self, n: int, stack: bool = True):
        """Up to `n` samples of the epoch (fewer at its end), None at the end. stack=True: one
        (uint8 array [k, nbytes], int64 labels [k], uint64 ids [k]) (equal sizes needed); else a
        list of (array, label, sample_id)."""
        n = _check.integer("Prefetcher.next_batch()", "n", n, lo=1, hi=1 << 24)
        return self._live().next_batch(n, _check.boolean("Prefetcher.next_batch()", "stack", stack))

    def stats(self) -> dict:
        """delivered, skipped, last_skip_error, bytes_read, epoch, consumer_wait_seconds, readers,
        buffer_samples, ready, buffered_bytes, peak_buffered_bytes, tuner (its decisions)."""
        return self._live().stats()

    @property
    def finished(self) -> bool:
        """Every epoch asked for has been delivered."""
        return self._live().finished

    @property
    def epoch_size(self) -> int:
        """Samples per epoch (before skips)."""
        return self._live().epoch_size


def _tensor(array):
    return torch.from_numpy(array) if torch is not None else array


def _shard(ids: Optional[Sequence[int]], size: int) -> Optional[list]:
    """This DataLoader worker's share of `ids` (all of the source's when None); None outside workers."""
    info = _torch_data.get_worker_info() if _torch_data is not None else None
    if info is None:
        return None if ids is None else list(ids)
    base = list(ids) if ids is not None else list(range(size))
    return base[info.id::info.num_workers]


class _Epochs:
    """Epoch bookkeeping shared by the feeds: an epoch left unfinished (a loop that broke out) is
    not resumed; the reader is reopened, as torch starts a new epoch. Across ranks (world_size > 1)
    the reopened one continues the ranks' common sequence of epochs (the other ranks' share of this
    epoch is unaffected); alone, it starts a fresh one. Subclasses set _options, _seed, _in_epoch,
    _restarts and _epochs_begun (epochs begun in this process) and provide prefetcher() and close()."""

    # The inverse of the prefetcher's seed multiplier (src/data/prefetcher.cc, PlanEpoch: the
    # order of epoch e is seeded with seed * 0x9E3779B97F4A7C15 + e, mod 2**64): a prefetcher with
    # seed + k * _SEED_STEP plans, as its epoch 0, epoch k of one with `seed`.
    _SEED_STEP = 17428512612931826493

    def begin_epoch(self):
        """The reader, positioned at the start of an epoch."""
        if self._in_epoch:
            self.close()
            self._restarts += 1
            if int(self._options.get("world_size", 1)) > 1:
                self._options["seed"] = (self._seed + self._epochs_begun * self._SEED_STEP) % (1 << 64)
            else:
                self._options["seed"] = self._seed + 1_000_003 * self._restarts
        self._in_epoch = True
        self._epochs_begun += 1
        return self.prefetcher()

    def end_epoch(self) -> None:
        self._in_epoch = False


class _EpochFeed(_Epochs):
    """One Prefetcher per process (opened at the first epoch, in the process that iterates: a
    DataLoader worker opens its own), endless, each iteration taking one epoch. Reading goes on
    into the next epoch while this one ends, so that an epoch boundary is not a stall."""

    def __init__(self, source, ids, options):
        self._source = _as_source(source)
        self._ids = None if ids is None else [int(i) for i in ids]
        self._options = dict(options)
        self._options.setdefault("epochs", 0)
        self._prefetcher: Optional[Prefetcher] = None
        self._pid = None
        self._in_epoch = False
        self._restarts = 0
        self._epochs_begun = 0  # epochs begun in this process (the index of the next one)
        self._seed = int(self._options.get("seed", 0))
        self._closed_bytes = 0  # bytes_read of the prefetchers closed so far (an epoch left unfinished)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_prefetcher"], state["_pid"] = None, None
        return state

    def share_is_empty(self) -> bool:
        """A torch DataLoader worker beyond the samples (more workers than ids) has none to read."""
        return _shard(self._ids, len(self._source)) == []

    def prefetcher(self) -> Prefetcher:
        if self._prefetcher is None or self._pid != os.getpid():
            self.close()
            self._prefetcher = Prefetcher(self._source, ids=_shard(self._ids, len(self._source)), **self._options)
            self._pid = os.getpid()
        return self._prefetcher

    def bytes_read(self, live: Optional[int] = None) -> int:
        """Bytes this process's prefetchers read from their source, all of them together. `live`:
        the open prefetcher's bytes_read from a stats() just taken (one snapshot: its readers may
        have read more since)."""
        if live is None:
            mine = self._prefetcher is not None and self._pid == os.getpid()
            live = self._prefetcher.stats()["bytes_read"] if mine else 0
        return self._closed_bytes + live

    def close(self) -> None:
        if self._prefetcher is not None:
            if self._pid == os.getpid() and self._prefetcher._impl is not None:
                self._closed_bytes += self._prefetcher.stats()["bytes_read"]
            self._prefetcher.close()  # in a forked worker this only forgets the parent's
        self._prefetcher = None


class _ServiceFeed(_Epochs):
    """The _EpochFeed of DataLoader(service=...): one stream from the node's data service (opened
    at the first epoch, in the process that iterates), endless, each iteration taking one epoch."""

    _SERVICE_OPTIONS = ("seed", "shuffle", "ordered", "rank", "world_size", "epochs", "on_error", "autotune",
                        "readers", "buffer_samples", "tune_interval")

    def __init__(self, address: str, job: str, token: str, ids, options):
        self._address, self._job, self._token = address, job, token
        self._ids = None if ids is None else [int(i) for i in ids]
        self._options = dict(options)
        self._stream = None
        self._pid = None
        self._in_epoch = False
        self._restarts = 0
        self._epochs_begun = 0
        self._seed = int(self._options.get("seed", 0))

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_stream"], state["_pid"] = None, None
        return state

    def prefetcher(self):
        if self._stream is None or self._pid != os.getpid():
            from ._data_service import ServiceStream
            self._stream = None
            self._stream = ServiceStream(self._address, job=self._job, token=self._token, ids=self._ids,
                                         **self._options)
            self._pid = os.getpid()
        return self._stream

    def close(self) -> None:
        if self._stream is not None and self._pid == os.getpid():
            self._stream.close()
        self._stream = None


def _default_transform(array: np.ndarray, label: int):
    return _tensor(array), label


if _torch_data is not None:
    _IterableBase = _torch_data.IterableDataset
else:  # pragma: no cover
    _IterableBase = object


class PrefetchDataset(_IterableBase):
    """A torch IterableDataset over a Prefetcher: each iteration is one epoch of
    transform(array, label) (default: (uint8 tensor, label)). With torch's DataLoader and
    num_workers > 0 each worker prefetches its own share of the samples.

    Keyword options: those of viper.data.Prefetcher (epochs is endless: iterate per epoch)."""

    def __init__(self, source, *, transform: Optional[Callable] = None, ids: Optional[Sequence[int]] = None,
                 **options):
        super().__init__()
        _callable("viper.data.PrefetchDataset()", "transform", transform)
        ids = _ids("viper.data.PrefetchDataset()", ids)
        self._feed = _EpochFeed(source, ids, options)
        self._transform = transform or _default_transform

    def __iter__(self):
        if self._feed.share_is_empty():
            return  # (a Prefetcher given no ids would read every sample)
        p = self._feed.begin_epoch()
        transform = self._transform
        for array, label, _ in p:
            yield transform(array, label)
        self._feed.end_epoch()

    def __len__(self) -> int:
        return len(self._feed._ids) if self._feed._ids is not None else len(self._feed._source)

    def stats(self) -> dict:
        """The prefetcher's stats() (this process's)."""
        return self._feed.prefetcher().stats()

    def close(self) -> None:
        self._feed.close()


class DataLoader(_Closable):
    """A drop-in for the reading part of torch.utils.data.DataLoader: iterating yields one epoch
    of batches, read ahead by the auto-tuned C++ prefetcher instead of worker processes.

    Fast path (no transform, no collate_fn): each batch is (uint8 tensor [B, nbytes], int64
    labels [B]) stacked in C++; batch_transform(x) may reinterpret it (x.view(torch.float32)...).
    With transform(array, label) per sample, batches are collate_fn (default: torch's
    default_collate) of the transformed samples. drop_last drops a short last batch. `shuffle`
    and `seed` set the epoch order; every other keyword is a Prefetcher option.

    shuffle defaults to True, unlike torch's DataLoader (False), on purpose: this loader is for
    training, and a source's natural order is usually sorted by class (a directory tree's labels
    are its top-level subdirectories), so an unshuffled epoch would train one class at a time.
    Also, shuffle=False alone is not torch's sequential order here: the readers deliver samples in
    the order their reads complete unless ordered=True. torch's shuffle=False behaviour is
    shuffle=False, ordered=True (deterministic, in the source's order; one slow read holds back the
    samples behind it).

    Data-parallel ranks: rank and world_size deal each epoch's global shuffle (by `seed`, which
    must be the same on every rank) out across the ranks, as torch's DistributedSampler does
    without padding: every sample exactly once per epoch across the ranks. With cache_nodes (every
    rank's cache node "HOST:PORT", the same list on every rank) the ranks share a collaborative
    cache (viper.data.SampleCache): this process starts node cache_nodes[cache_node] (default:
    cache_nodes[rank]); cache_token is the nodes' shared secret and cache_options the other
    SampleCache keywords (name, insecure, max_bytes, timeout, retry_down, start_node: False when
    another process on this host runs the node, e.g. several ranks or jobs per host).

    service="HOST:PORT" attaches to the node's data service (viper.data.DataService) instead: the
    service reads (source may be None; a Source given is checked against the service's sample
    count), caches every sample once in its shared memory for every process of the host, and
    hands out each sample mapped from there. service_job names this loader's job (default
    "pid-<pid>"; the ranks of one job on this host share its budget), service_token is the
    service's secret. With service the keywords are seed, shuffle, ordered, rank, world_size,
    epochs, on_error, autotune, readers, buffer_samples and tune_interval: the job's budget at the
    service sets the readers' and memory caps. Per-sample arrays (transform/collate_fn) are
    read-only views of the service's memory, valid until the loader is closed."""

    def __init__(self, source, batch_size: int = 1, *, shuffle: bool = True, drop_last: bool = False,
                 transform: Optional[Callable] = None, collate_fn: Optional[Callable] = None,
                 batch_transform: Optional[Callable] = None, ids: Optional[Sequence[int]] = None,
                 rank: int = 0, world_size: int = 1, cache_nodes: Optional[Sequence[str]] = None,
                 cache_node: Optional[int] = None, cache_token: str = "",
                 cache_options: Optional[Mapping[str, Any]] = None, service: Optional[str] = None,
                 service_job: Optional[str] = None, service_token: str = "", **options):
        owner = "viper.data.DataLoader()"
        self.batch_size = _check.integer(owner, "batch_size", batch_size, lo=1, hi=1 << 24)
        self.drop_last = _check.boolean(owner, "drop_last", drop_last)
        _check.boolean(owner, "shuffle", shuffle)
        for name, fn in (("transform", transform), ("collate_fn", collate_fn), ("batch_transform", batch_transform)):
            _callable(owner, name, fn)
        ids = _ids(owner, ids)
        self.world_size = _check.integer(owner, "world_size", world_size, lo=1, hi=1 << 20)
        self.rank = _check.integer(owner, "rank", rank, lo=0, hi=self.world_size - 1)
        self._transform = transform
        self._collate = collate_fn
        self._batch_transform = batch_transform
        self._epoch_samples: list = []
        self.cache: Optional[SampleCache] = None
        self.service: Optional[str] = None
        if service is not None:
            self.service = _check.address(owner, "service", service)
            if cache_nodes is not None or cache_options is not None or cache_node is not None or cache_token:
                raise TypeError(f"{owner}: service={service!r} and cache_nodes/cache_*: give one (the service runs "
                                "the cache)")
            job = f"pid-{os.getpid()}" if service_job is None else _check.text(owner, "service_job", service_job, 128)
            service_token = _check.text(owner, "service_token", service_token, allow_empty=True)
            for name in options:
                if name not in _ServiceFeed._SERVICE_OPTIONS:
                    raise TypeError(f"{owner}: {name}=... is not an option with service= (the job's budget at the "
                                    f"service sets readers and memory); options: {', '.join(_ServiceFeed._SERVICE_OPTIONS)}")
            options = dict(options, shuffle=shuffle)
            if self.world_size > 1:
                options.update(rank=self.rank, world_size=self.world_size)
            self._feed = _ServiceFeed(self.service, job, service_token, ids, options)
            self.job = job
            stream = self._feed.prefetcher()  # attach now: a wrong address or a refused job fails here
            if isinstance(source, Source) and len(source) != stream.samples:
                self._feed.close()
                raise _viper.InvalidArgumentError(f"{owner}: source has {len(source)} samples but the service at "
                                                  f"{service} serves {stream.samples}: another data set")
            self._samples = stream.samples
            _close_at_exit(self)
            return
        elif service_job is not None or service_token:
            raise TypeError(f"{owner}: service_job and service_token need service")
        if cache_nodes is not None:
            nodes = _nodes(owner, cache_nodes)
            node = self.rank if cache_node is None else cache_node
            if cache_node is None and self.rank >= len(nodes):
                raise _viper.InvalidArgumentError(f"{owner}: rank={self.rank} but cache_nodes has {len(nodes)} entries: "
                                                  "give cache_node (this process's index in cache_nodes)")
            if cache_options is not None:
                _check.mapping(owner, "cache_options", cache_options, expected="a dict of SampleCache keywords")
            self.cache = SampleCache(source, nodes, node, token=cache_token, **dict(cache_options or {}))
            source = self.cache
        elif cache_options is not None or cache_node is not None or cache_token:
            raise TypeError(f"{owner}: cache_node, cache_token and cache_options need cache_nodes")
        options = dict(options, shuffle=shuffle)
        if self.world_size > 1:
            options.update(rank=self.rank, world_size=self.world_size)
        self._feed = _EpochFeed(source, ids, options)
        _close_at_exit(self)

    def __iter__(self):
        if getattr(self, "_closed", False):  # (else a new epoch would start new readers)
            raise _viper.Error("DataLoader is closed")
        p = self._feed.begin_epoch()
        per_sample = self._transform is not None or self._collate is not None
        self._epoch_samples.append(0)
        while True:
            batch = p.next_batch(self.batch_size, stack=not per_sample)
            if batch is None:
                self._feed.end_epoch()
                return
            n = len(batch) if per_sample else len(batch[0])
            if n < self.batch_size and self.drop_last:
                # The epoch's end is next: consume it so that the next iteration starts a new epoch.
                if p.next_batch(1) is not None:
                    raise _viper.Error("internal: samples after a short batch")
                self._feed.end_epoch()
                return
            self._epoch_samples[-1] += n
            yield self._per_sample(batch) if per_sample else self._stacked(batch)

    def _stacked(self, batch):
        data, labels, _ = batch
        x = _tensor(data)
        if self._batch_transform is not None:
            x = self._batch_transform(x)
        return x, _tensor(labels)

    def _per_sample(self, batch):
        transform = self._transform or _default_transform
        items = [transform(array, label) for array, label, _ in batch]
        collate = self._collate or _torch_data.default_collate
        out = collate(items)
        return self._batch_transform(out) if self._batch_transform is not None else out

    def __len__(self) -> int:
        if self.service is not None:
            n = len(self._feed._ids) if self._feed._ids is not None else self._samples
        else:
            n = len(self._feed._ids) if self._feed._ids is not None else len(self._feed._source)
        n = (n - self.rank + self.world_size - 1) // self.world_size  # this rank's share
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def stats(self) -> dict:
        """The prefetcher's stats(), plus source_bytes (bytes read from the source since the
        loader started: with a cache, only what no node held), epoch_samples (samples this rank
        yielded in each epoch begun, oldest first) and, with cache_nodes, cache (the
        SampleCache's stats()). With service: wait_seconds (time this process waited for the
        service's replies), mapped_samples and inline_samples (samples mapped from the service's
        shared memory, and sent through the socket), job, epoch_samples, source_bytes (the job's,
        all its processes together) and service (the job's stats at the service: wait_seconds,
        cache_hits, source_bytes, readers, budget...)."""
        if self.service is not None:
            stream = self._feed.prefetcher()
            st = stream.stats()
            st["job"] = self.job
            st["epoch_samples"] = list(self._epoch_samples)
            st["service"] = stream.service_stats()["jobs"].get(self.job, {})
            st["source_bytes"] = st["service"].get("source_bytes", 0)
            return st
        st = self._feed.prefetcher().stats()
        st["epoch_samples"] = list(self._epoch_samples)
        if self.cache is not None:
            st["cache"] = self.cache.stats()
            st["source_bytes"] = st["cache"]["source_bytes"]
        else:
            st["source_bytes"] = self._feed.bytes_read(live=st["bytes_read"])  # the same snapshot
        return st

    def close(self) -> None:
        """Stops the readers and this rank's cache node (also done when the loader is
        garbage-collected)."""
        self._closed = True
        feed = getattr(self, "_feed", None)
        if feed is not None:
            feed.close()
        if self.cache is not None:
            self.cache.close()


def _exact_samples(owner: str, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`x` as a C-contiguous array of `dtype`. InvalidArgumentError naming the first value that
    dtype cannot hold exactly: for an integer or bool buffer a fraction, NaN, inf or a number out
    of its range; for a float buffer a finite number that would become inf (rounding to the
    buffer's precision is accepted, as numpy's assignment does)."""
    if x.dtype == dtype:
        return np.ascontiguousarray(x)
    if x.dtype.kind not in "biuf":
        raise TypeError(f"{owner}: x of dtype {x.dtype}: expected numbers (bool, integer or float)")
    with np.errstate(invalid="ignore", over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN or out of range into an integer: refused below
        out = np.ascontiguousarray(x, dtype=dtype)
        bad = (np.isfinite(x) & ~np.isfinite(out)) if dtype.kind == "f" else (out != x)
    if bad.any():
        at = np.unravel_index(int(np.flatnonzero(bad)[0]), x.shape)
        where = ", ".join(str(int(i)) for i in at)
        raise _viper.InvalidArgumentError(f"{owner}: x[{where}]={x[at].item()!r}: the buffer's dtype {dtype} cannot hold "
                                          f"it exactly (it would be stored as {out[at].item()!r})")
    return out


def _labels(owner: str, y) -> list:
    """The labels as Python ints; InvalidArgumentError naming the first that is not an integer
    (1.7; 2.0 is taken as 2) or does not fit in int64, TypeError for one that is not a number."""
    values = y.tolist() if hasattr(y, "tolist") else y
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{owner}: y={_check.shown(y)}: expected a sequence of integer labels, got {type(y).__name__}")
    out = []
    for i, v in enumerate(values):
        if type(v) is not int:
            if isinstance(v, numbers.Integral):
                v = int(v)
            elif isinstance(v, numbers.Real) and math.isfinite(v) and float(v).is_integer():
                v = int(v)
            elif isinstance(v, numbers.Real):
                raise _viper.InvalidArgumentError(f"{owner}: y[{i}]={v!r}: a label must be an integer")
            else:
                raise TypeError(f"{owner}: y[{i}]={_check.shown(v)}: expected an integer label, got {type(v).__name__}")
        if not -(1 << 63) <= v < (1 << 63):
            raise _viper.InvalidArgumentError(f"{owner}: y[{i}]={v}: a label must fit in int64")
        out.append(v)
    return out


def _same_length(owner: str, x, y) -> None:
    """InvalidArgumentError unless the batch has one label per sample (mix() returns them side by side)."""
    if len(x) != len(y):
        raise _viper.InvalidArgumentError(f"{owner}: {len(x)} samples in x but {len(y)} labels in y")


def _numpy_dtype(dtype) -> np.dtype:
    if torch is not None and isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).numpy().dtype
    return np.dtype(dtype)


class RehearsalBuffer(_Handle):
    """A bounded, representative set of past samples of one shape and dtype, mixed into new
    batches against catastrophic forgetting.

    policy="reservoir" (default) keeps every sample seen with equal probability; "class_balanced"
    keeps the classes as equal as the stream allows. `ratio`: rehearsal samples mixed in per new
    sample (0.5: a batch of 32 new gets 16 old). With spill_dir, spill() persists the buffer and a
    buffer opened on the same directory restores it (validated)."""

    def __init__(self, capacity: int = 1024, *, sample_shape: Sequence[int], dtype="float32", ratio: float = 0.5,
                 **options):
        owner = "viper.data.RehearsalBuffer()"
        capacity = _check.integer(owner, "capacity", capacity, lo=1)
        ratio = _check.number(owner, "ratio", ratio, lo=0.0)
        if isinstance(sample_shape, (str, bytes)) or not hasattr(sample_shape, "__iter__"):
            raise TypeError(f"{owner}: sample_shape={_check.shown(sample_shape)}: expected a sequence of ints, "
                            f"got {type(sample_shape).__name__}")
        self.sample_shape = tuple(_check.integer(owner, f"sample_shape[{i}]", d, lo=1, hi=1 << 40)
                                  for i, d in enumerate(sample_shape))
        self.dtype = _numpy_dtype(dtype)
        self.ratio = float(ratio)
        nbytes = int(np.prod(self.sample_shape, dtype=np.int64)) * self.dtype.itemsize
        if nbytes < 1:
            raise _viper.InvalidArgumentError(f"sample_shape {self.sample_shape} of {self.dtype} has no bytes")
        if "spill_dir" in options:
            options["spill_dir"] = os.fspath(options["spill_dir"])
        self.capacity = int(capacity)
        self.policy = options.get("policy", "reservoir")
        self._impl = _viper._RehearsalBuffer(_viper._RehearsalOptions(capacity=int(capacity), sample_bytes=nbytes,
                                                                      **options))
        _close_at_exit(self)

    def _rows(self, x) -> np.ndarray:
        if torch is not None and isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
        x = np.asarray(x)
        if x.shape[1:] != self.sample_shape:
            raise _viper.InvalidArgumentError(f"samples of shape {x.shape[1:]}, the buffer holds {self.sample_shape}")
        return _exact_samples("RehearsalBuffer.add()", x, self.dtype)

    def add(self, x, y) -> int:
        """Offers a batch (x [B, *sample_shape], integer labels y [B]); returns how many samples
        stayed. Values the buffer's dtype cannot hold exactly are refused (InvalidArgumentError
        naming the first): fractions or out-of-range numbers for an integer buffer, non-integer
        labels; nothing is added then. GIL released."""
        rows = self._rows(x)
        labels = _labels("RehearsalBuffer.add()", y)
        if len(labels) != len(rows):
            raise _viper.InvalidArgumentError(f"RehearsalBuffer.add(): {len(rows)} samples but {len(labels)} labels")
        return self._live().add_rows(rows, labels)

    def sample(self, k: int, as_numpy: bool = False):
        """`k` distinct samples drawn uniformly (fewer if the buffer holds fewer): (x, y), torch
        tensors (numpy arrays with as_numpy=True)."""
        data, labels = self._live().draw(_check.integer("RehearsalBuffer.sample()", "k", k))
        x = data.view(self.dtype).reshape((len(labels),) + self.sample_shape)
        if as_numpy or torch is None:
            return x, labels
        return torch.from_numpy(x), torch.from_numpy(labels)

    def mix(self, x, y, ratio: Optional[float] = None, add: bool = True):
        """The new batch (x, y) followed by round(len(x) * ratio) rehearsal samples drawn from the
        buffer (none while it is empty); then, with add=True, the new samples are offered to the
        buffer (after the draw, so that a batch never rehearses itself). Returns torch tensors
        when x is one, else numpy arrays."""
        r = self.ratio if ratio is None else _check.number("RehearsalBuffer.mix()", "ratio", ratio, lo=0.0)
        _check.boolean("RehearsalBuffer.mix()", "add", add)
        _same_length("RehearsalBuffer.mix()", x, y)
        k = int(round(len(x) * r))
        is_torch = torch is not None and isinstance(x, torch.Tensor)
        old_x, old_y = self.sample(k, as_numpy=not is_torch) if k > 0 and len(self) > 0 else (None, None)
        if add:
            self.add(x, y)
        if old_x is None:
            return x, y
        if is_torch:
            y_t = y if isinstance(y, torch.Tensor) else torch.as_tensor(y)
            return torch.cat([x, old_x.to(x.dtype)]), torch.cat([y_t, old_y.to(y_t.dtype)])
        return np.concatenate([np.asarray(x), old_x]), np.concatenate([np.asarray(y), old_y])

    def spill(self) -> None:
        """Writes the buffer to spill_dir atomically (GIL released)."""
        self._live().spill()

    _STATE_FORMAT = "viper.data.RehearsalBuffer/1"

    def state_dict(self) -> dict:
        """Everything needed to resume the buffer exactly, as torch's state_dict convention has it
        (a dict of tensors and plain Python values, for torch.save beside the model's):
        format, policy, capacity, sample_shape, dtype (str), ratio; samples [n, *sample_shape]
        (a torch tensor of the buffer's dtype; a numpy array if torch lacks that dtype), labels
        and members (int64 tensors: the sampler's per-class order), seen, class_seen, and rng (the
        generator's state, so that later add() and sample() calls repeat exactly). The samples are
        copied (n * sample bytes)."""
        st = self._live().state()
        n = len(st["labels"])
        x = st["samples"].view(self.dtype).reshape((n,) + self.sample_shape)
        out = {"format": self._STATE_FORMAT, "policy": self.policy, "capacity": self.capacity,
               "sample_shape": list(self.sample_shape), "dtype": str(self.dtype), "ratio": self.ratio,
               "samples": x, "labels": st["labels"], "members": st["members"].astype(np.int64),
               "seen": int(st["seen"]), "class_seen": {int(k): int(v) for k, v in st["class_seen"].items()},
               "rng": st["rng"]}
        if torch is not None:
            for key in ("labels", "members", "samples"):
                try:
                    out[key] = torch.from_numpy(out[key])
                except TypeError:  # a numpy dtype torch does not have (uint16 ...): stays numpy
                    pass
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a state_dict() (of a buffer with the same policy, sample_shape and dtype; the
        capacity may differ if the samples fit). Replaces samples, counts, the sampler's order,
        the generator and ratio; InvalidArgumentError naming what does not fit, the buffer unchanged
        then."""
        owner = "RehearsalBuffer.load_state_dict()"
        _check.mapping(owner, "state", state, expected="a RehearsalBuffer.state_dict()")
        missing = [k for k in ("format", "policy", "sample_shape", "dtype", "ratio", "samples", "labels", "members",
                               "seen", "class_seen", "rng") if k not in state]
        if missing:
            raise _viper.InvalidArgumentError(f"{owner}: state lacks {', '.join(missing)}")
        if state["format"] != self._STATE_FORMAT:
            raise _viper.InvalidArgumentError(f"{owner}: state format={_check.shown(state['format'])}: must be "
                                              f"{self._STATE_FORMAT!r}")
        for key, mine in (("policy", self.policy), ("sample_shape", list(self.sample_shape)),
                          ("dtype", str(self.dtype))):
            theirs = list(state[key]) if key == "sample_shape" else state[key]
            if theirs != mine:
                raise _viper.InvalidArgumentError(f"{owner}: state {key}={_check.shown(state[key])}: this buffer has "
                                                  f"{mine!r}")
        ratio = _check.number(owner, "state ratio", state["ratio"], lo=0.0)

        def array(key, dtype):
            v = state[key]
            if torch is not None and isinstance(v, torch.Tensor):
                v = v.detach().cpu().numpy()
            return np.ascontiguousarray(np.asarray(v), dtype=dtype)

        samples = array("samples", self.dtype)
        labels = array("labels", np.int64)
        members = array("members", np.int64)
        if samples.shape[1:] != self.sample_shape or len(samples) != len(labels):
            raise _viper.InvalidArgumentError(f"{owner}: state samples of shape {samples.shape} and {len(labels)} "
                                              f"labels: expected [{len(labels)}, {', '.join(map(str, self.sample_shape))}]")
        if (members < 0).any():
            raise _viper.InvalidArgumentError(f"{owner}: state members hold a negative index")
        class_seen = {_check.integer(owner, "state class_seen label", k, lo=-1):
                      _check.integer(owner, "state class_seen count", v) for k, v in dict(state["class_seen"]).items()}
        self._live().load_state(samples.reshape(len(labels), -1).view(np.uint8), labels.tolist(),
                                members.astype(np.uint64).tolist(), _check.integer(owner, "state seen", state["seen"], lo=0),
                                class_seen, _check.text(owner, "state rng", state["rng"], max_bytes=1 << 16))
        self.ratio = float(ratio)

    def __len__(self) -> int:
        return len(self._live())

    @property
    def seen(self) -> int:
        """Samples offered since the buffer began (restores included)."""
        return self._live().seen

    @property
    def class_counts(self) -> dict:
        """label -> samples held."""
        return self._live().class_counts

    @property
    def class_seen(self) -> dict:
        """label -> samples offered."""
        return self._live().class_seen

    @property
    def spill_path(self) -> str:
        """The spill file ('' without spill_dir)."""
        return self._live().spill_path


Prefetcher.__doc__ += "\n\n" + textwrap.indent(_viper._PrefetchOptions.__doc__, "    ")
RehearsalBuffer.__doc__ += "\n\n" + textwrap.indent(_viper._RehearsalOptions.__doc__, "    ")


from ._data_service import DataService, ServiceControl, ServiceError  # noqa: E402 (they use this module)
from ._rehearsal_dist import DistributedRehearsalBuffer  # noqa: E402 (it builds on the classes above)
