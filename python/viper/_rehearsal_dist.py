"""viper.data.DistributedRehearsalBuffer: one rehearsal buffer whose capacity is spread over the
shards of data-parallel ranks (docs/ARCHITECTURE.md "Data side", "Distributed rehearsal").

Each rank keeps one shard, a viper.data.RehearsalBuffer of capacity/n samples fed by the samples
this rank sees, and talks to the others over its collaborative sample cache (the same membership
and UCX transport: SampleCache.put_object / get_object). No rank coordinates the others:

- after each mix() a rank publishes a *pack* of its shard into its own cache node: up to `pack`
  samples drawn uniformly from the shard (under class_balanced split evenly over the classes it
  holds, each class's a uniform subset of the shard's samples of that class), with the shard's
  counts (samples seen, seen and held per class);
- a background thread per other shard fetches that shard's latest pack while the training step
  runs (prefetch), so that the next mix() finds it there; mix() waits for a fetch still in flight
  at most `max_wait` seconds, then uses the pack it had (the wait is in stats());
- mix() draws k = round(ratio * len(x)) samples from the global buffer: reservoir: each draw picks
  shard r with probability seen_r / sum(seen) (the counts from the packs), then a sample of r's
  pack uniformly (distinct within one draw). Shard r holds each of its seen_r samples with
  probability c_r / seen_r and its pack is a uniform subset, so every sample seen by any rank is
  drawn with the same probability 1 / sum(seen): the draws are those of one reservoir over all
  ranks' streams. class_balanced: the classes' shares are what one class-balanced buffer of the
  whole capacity would hold given the global counts seen per class (the largest classes equal,
  smaller ones whole: water-filling), and within a class the shard is picked in proportion to its
  samples seen of that class;
- a shard whose pack cannot be fetched (its rank died, its node is unreachable) is left out of the
  draws until it answers again: mix() never waits for it longer than max_wait.

spill() and state_dict() are per shard: each rank spills its shard to <spill_dir>/shard-<i> and
restores it from there, and its state_dict() holds its shard.
"""
from __future__ import annotations

import json
import os
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from . import _Closable, _close_at_exit, _viper
from . import _checks as _check

_MAGIC = b"VRPK"
_VERSION = 1
_HEADER = struct.Struct("<4sII")  # magic, version, meta length
_MAX_META = 1 << 20


def _bad(what: str) -> Exception:
    return _viper.Error(f"rehearsal pack: {what}")


def encode_pack(meta: Mapping[str, Any], labels: np.ndarray, samples: np.ndarray) -> bytes:
    """The pack's bytes: header, JSON meta, int64 labels [n], samples [n, sample_bytes]."""
    m = json.dumps(dict(meta), separators=(",", ":")).encode()
    return b"".join([_HEADER.pack(_MAGIC, _VERSION, len(m)), m, np.ascontiguousarray(labels, np.int64).tobytes(),
                     np.ascontiguousarray(samples, np.uint8).tobytes()])


def _counts(meta: Mapping[str, Any], key: str) -> Dict[int, int]:
    v = meta.get(key)
    if not isinstance(v, dict):
        raise _bad(f"meta {key} is not an object")
    out = {}
    for k, n in v.items():
        try:
            label = int(k)
        except ValueError:
            raise _bad(f"meta {key} has label {k!r}: not an integer") from None
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise _bad(f"meta {key}[{k}]={n!r}: not a count >= 0")
        out[label] = n
    return out


def decode_pack(data: bytes, sample_bytes: int, shard: int) -> dict:
    """Parses and checks a pack (bytes from another rank's node): viper.Error naming the
    fault. Returns meta fields plus labels and samples (numpy, [n] and [n, sample_bytes])."""
    if len(data) < _HEADER.size:
        raise _bad(f"{len(data)} bytes: shorter than its {_HEADER.size}-byte header")
    magic, version, meta_len = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise _bad(f"magic {magic!r}, expected {_MAGIC!r}")
    if version != _VERSION:
        raise _bad(f"version {version}, this reader knows {_VERSION}")
    if meta_len > _MAX_META or _HEADER.size + meta_len > len(data):
        raise _bad(f"meta of {meta_len} bytes does not fit the {len(data)}-byte pack (limit {_MAX_META})")
    try:
        meta = json.loads(bytes(data[_HEADER.size:_HEADER.size + meta_len]))
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, or nested past the parser's depth
        raise _bad(f"meta is not JSON: {e}") from None
    if not isinstance(meta, dict):
        raise _bad("meta is not an object")
    for key in ("shard", "seq", "seen", "n", "sample_bytes"):
        v = meta.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise _bad(f"meta {key}={v!r}: not an integer >= 0")
    if meta["shard"] != shard:
        raise _bad(f"shard {meta['shard']} where shard {shard}'s pack was expected")
    if meta["sample_bytes"] != sample_bytes:
        raise _bad(f"samples of {meta['sample_bytes']} bytes, this buffer's are {sample_bytes}")
    n = meta["n"]
    body = len(data) - _HEADER.size - meta_len
    if body != n * (8 + sample_bytes):
        raise _bad(f"{body} bytes after the meta, {n} samples of {sample_bytes} bytes and their labels need "
                   f"{n * (8 + sample_bytes)}")
    class_seen, class_held = _counts(meta, "class_seen"), _counts(meta, "class_held")
    if sum(class_seen.values()) != meta["seen"]:
        raise _bad(f"class_seen adds up to {sum(class_seen.values())}, seen is {meta['seen']}")
    for c, h in class_held.items():
        if h > class_seen.get(c, 0):
            raise _bad(f"class {c}: {h} held but {class_seen.get(c, 0)} seen")
    off = _HEADER.size + meta_len
    labels = np.frombuffer(data, np.int64, n, off)
    samples = np.frombuffer(data, np.uint8, n * sample_bytes, off + 8 * n).reshape(n, sample_bytes)
    got = {int(c): int(k) for c, k in zip(*np.unique(labels, return_counts=True))}
    for c, k in got.items():
        if k > class_held.get(c, 0):
            raise _bad(f"class {c}: {k} samples in the pack but {class_held.get(c, 0)} held")
    return {"seen": meta["seen"], "seq": meta["seq"], "class_seen": class_seen, "class_held": class_held,
            "labels": labels, "samples": samples}


def water_fill(capacity: int, seen: Mapping[int, int]) -> Dict[int, float]:
    """What one class-balanced buffer of `capacity` holds per class after seeing `seen` per class:
    the largest classes equal, a class seen less than its equal share held whole."""
    out, left = {}, float(capacity)
    order = sorted(seen, key=lambda c: seen[c])
    for i, c in enumerate(order):
        out[c] = min(float(seen[c]), left / (len(order) - i))
        left -= out[c]
    return out


def plan_draws(k: int, packs: Mapping[int, dict], policy: str, capacity: int,
               rng: np.random.Generator) -> Dict[tuple, int]:
    """How many of k draws come from each (shard, label) (label None under reservoir), given the
    shards' packs (meta: seen, class_seen, class_held; labels). Shards with nothing held get none."""
    keys: List[tuple] = []
    weights: List[float] = []
    if policy == "reservoir":
        for s, p in packs.items():
            if len(p["labels"]) > 0 and p["seen"] > 0:
                keys.append((s, None))
                weights.append(float(p["seen"]))
    else:
        total: Dict[int, int] = {}
        for p in packs.values():
            for c, n in p["class_seen"].items():
                total[c] = total.get(c, 0) + n
        share = water_fill(capacity, total)
        for c, t in share.items():
            holders = [(s, p["class_seen"].get(c, 0)) for s, p in packs.items()
                       if p["class_held"].get(c, 0) > 0 and np.any(p["labels"] == c)]
            denom = sum(n for _, n in holders)
            for s, n in holders:
                if denom > 0 and n > 0:
                    keys.append((s, c))
                    weights.append(t * n / denom)
    if not keys or k <= 0:
        return {}
    w = np.asarray(weights, dtype=np.float64)
    counts = rng.multinomial(k, w / w.sum())
    return {key: int(n) for key, n in zip(keys, counts) if n > 0}


class DistributedRehearsalBuffer(_Closable):
    """A rehearsal buffer of `capacity` samples spread over the shards of data-parallel ranks,
    one shard per cache node, talking over the ranks' collaborative sample cache.

        loader = vd.DataLoader(src, batch_size=32, rank=r, world_size=n, seed=0, cache_nodes=nodes, ...)
        buf = vd.DistributedRehearsalBuffer(4000, cache=loader.cache, sample_shape=(3, 32, 32),
                                            dtype="float32", ratio=0.5, policy="class_balanced")
        for x, y in loader:
            x, y = buf.mix(x, y)   # x plus round(0.5 * len(x)) samples of the global buffer

`cache`: the rank's viper.data.SampleCache (or a DataLoader with cache_nodes); the shards are
cache.nodes, numbered in the order of their addresses (so the ranks may list them in any order),
this rank's is its node's (one each: a node attached with start_node=False would
share its host's shard and is refused). The shard holds capacity // n samples (one more on the
first capacity % n shards). mix() draws from every shard's latest pack (see the module's doc):
the draws are those of one buffer over every rank's stream, reservoir or class-balanced. `pack`:
samples per shard published after each mix() (under class_balanced split evenly over its
classes), the most one mix() takes from one shard (class) without repeating; `max_wait`: seconds
mix() waits for a prefetch still in flight; `key`: the objects' name in the nodes (two buffers
over one cache need two keys and two spill_dirs).
spill_dir: each rank spills its shard to <spill_dir>/shard-<i> and restores it when opened.
Other keyword options go to the shard (viper.data.RehearsalBuffer)."""

    _STATE_FORMAT = "viper.data.DistributedRehearsalBuffer/1"

    def __init__(self, capacity: int, *, cache, sample_shape: Sequence[int], dtype="float32", ratio: float = 0.5,
                 policy: str = "reservoir", seed: int = 0, spill_dir=None, pack: int = 64, max_wait: float = 1.0,
                 key: str = "rehearsal", **options):
        from .data import RehearsalBuffer, SampleCache  # noqa: PLC0415 (data imports this module)
        owner = "viper.data.DistributedRehearsalBuffer()"
        cache = getattr(cache, "cache", cache)  # a DataLoader: its cache
        if not isinstance(cache, SampleCache):
            raise TypeError(f"{owner}: cache={_check.shown(cache)}: expected a viper.data.SampleCache or a DataLoader "
                            "with cache_nodes")
        if not cache.start_node:
            raise _viper.InvalidArgumentError(f"{owner}: cache node {cache.node} is attached (start_node=False): one "
                                              "shard per node, kept by the process that runs the node")
        # Shard s is the node at place s among the nodes' sorted addresses, the same on every rank
        # whatever the order of its list (which the cache lets each rank choose); before, it was
        # this rank's list index, and ranks listing the nodes in different orders all published
        # shard 0 and fetched nothing from each other.
        by_address = sorted(cache.nodes)
        if len(set(by_address)) != len(by_address):
            raise _viper.InvalidArgumentError(f"{owner}: the cache's nodes list a node twice: {cache.nodes}")
        self.shards = len(by_address)
        self.shard = by_address.index(cache.nodes[cache.node])
        self._node_of_shard = [cache.nodes.index(address) for address in by_address]
        capacity = _check.integer(owner, "capacity", capacity, lo=self.shards)
        if policy not in ("reservoir", "class_balanced"):
            raise _viper.InvalidArgumentError(f"{owner}: policy={_check.shown(policy)}: must be 'reservoir' or "
                                              "'class_balanced'")
        self.pack = _check.integer(owner, "pack", pack, lo=1, hi=1 << 20)
        self.max_wait = _check.number(owner, "max_wait", max_wait, lo=0.0)
        self.seed = _check.integer(owner, "seed", seed)
        key = _check.text(owner, "key", key)
        if not key.replace("_", "").replace("-", "").isalnum() or not key.isascii() or len(key) > 40:
            raise _viper.InvalidArgumentError(f"{owner}: key={key!r} must be 1-40 characters of [A-Za-z0-9_-]")
        self.capacity = capacity
        self.policy = policy
        self.ratio = _check.number(owner, "ratio", ratio, lo=0.0)
        shard_capacity = capacity // self.shards + (1 if self.shard < capacity % self.shards else 0)
        if spill_dir is not None:
            options["spill_dir"] = os.path.join(os.fspath(spill_dir), f"shard-{self.shard}")
        self.local = RehearsalBuffer(shard_capacity, sample_shape=sample_shape, dtype=dtype, ratio=ratio,
                                     policy=policy, seed=self.seed * 1000003 + self.shard, **options)
        self.sample_shape, self.dtype = self.local.sample_shape, self.local.dtype
        self._sample_bytes = int(np.prod(self.sample_shape, dtype=np.int64)) * self.dtype.itemsize
        self._cache = cache
        self._key = key
        self._rng = np.random.default_rng([self.seed, self.shard, 0x5eed])
        self._seq = 0
        self._mu = threading.Lock()
        self._packs: Dict[int, dict] = {}         # shard -> latest decoded pack (own included)
        self._down: Dict[int, str] = {}           # shard -> why its last fetch failed
        self._inflight: Dict[int, Any] = {}       # shard -> Future of its fetch
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.shards - 1), thread_name_prefix="rehearsal-fetch")
        self._stats = {"mixes": 0, "wait_seconds": 0.0, "wait_max_seconds": 0.0, "mix_seconds": 0.0,
                       "local_draws": 0, "remote_draws": 0, "fetches": 0, "fetch_failures": 0, "fetched_bytes": 0,
                       "stale_packs": 0, "published_bytes": 0}
        self._closed = False
        self._publish()
        self._prefetch()
        _close_at_exit(self)

    # -- packs ---------------------------------------------------------------------------------

    def _object(self, shard: int) -> str:
        return f"{self._key}-{shard}"

    def _publish(self) -> None:
        """Draws this shard's pack, keeps it as the own shard's source of draws and puts it into
        the own node for the other ranks."""
        live = self.local._live()
        n = len(live)
        if self.policy == "reservoir":
            data, labels = live.draw(min(n, self.pack))
        else:  # about `pack` in all, split evenly over the classes held, each a uniform subset of its class
            held = live.class_counts
            per_class = -(-self.pack // max(1, len(held)))
            parts = [live.draw(per_class, int(c)) for c in held]
            data = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, self._sample_bytes), np.uint8)
            labels = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        class_seen = {int(c): int(v) for c, v in live.class_seen.items()}
        class_held = {int(c): int(v) for c, v in live.class_counts.items()}
        self._seq += 1
        meta = {"shard": self.shard, "seq": self._seq, "seen": int(live.seen), "n": int(len(labels)),
                "sample_bytes": self._sample_bytes, "class_seen": class_seen, "class_held": class_held}
        blob = encode_pack(meta, labels, data)
        pack = {"seen": meta["seen"], "seq": self._seq, "class_seen": class_seen, "class_held": class_held,
                "labels": np.asarray(labels, np.int64),
                "samples": np.asarray(data, np.uint8).reshape(-1, self._sample_bytes)}
        with self._mu:
            self._packs[self.shard] = pack
        self._cache._cache.put_object(self._object(self.shard), blob)
        self._stats["published_bytes"] += len(blob)

    def _fetch(self, shard: int) -> None:
        """One fetch of `shard`'s latest pack (a pool thread; the GIL is released while it waits)."""
        try:
            blob = self._cache._cache.get_object(self._node_of_shard[shard], self._object(shard))
            pack = None if blob is None else decode_pack(blob, self._sample_bytes, shard)
        except _viper.Error as e:
            with self._mu:
                self._down[shard] = str(e)
                self._packs.pop(shard, None)
                self._stats["fetch_failures"] += 1
            return
        with self._mu:
            self._down.pop(shard, None)
            self._stats["fetches"] += 1
            if pack is not None:
                self._stats["fetched_bytes"] += len(blob)
                self._packs[shard] = pack

    def _prefetch(self) -> None:
        """Starts a fetch of every other shard's pack that has none in flight."""
        for s in range(self.shards):
            if s == self.shard or self._closed:
                continue
            f = self._inflight.get(s)
            if f is None or f.done():
                self._inflight[s] = self._pool.submit(self._fetch, s)

    def _await(self) -> float:
        """Waits (at most max_wait in all) for the fetches in flight; returns the seconds waited."""
        t0 = time.perf_counter()
        deadline = t0 + self.max_wait
        for s, f in list(self._inflight.items()):
            left = deadline - time.perf_counter()
            if not f.done():
                try:
                    f.result(timeout=max(0.0, left))
                except Exception:  # noqa: BLE001 (a timeout: that shard's pack stays the old one)
                    self._stats["stale_packs"] += 1
        return time.perf_counter() - t0

    # -- drawing ---------------------------------------------------------------------------------

    def sample(self, k: int, as_numpy: bool = False):
        """k samples drawn from the global buffer (see the class doc), from the packs at hand
        (waiting at most max_wait for fetches in flight): (x, y), torch tensors (numpy with
        as_numpy=True); none while no shard holds a sample."""
        k = _check.integer("DistributedRehearsalBuffer.sample()", "k", k)
        self._check_open("sample")
        self._note_wait(self._await())
        return self._draw(k, as_numpy)

    def _note_wait(self, wait: float) -> None:
        self._stats["wait_seconds"] += wait
        self._stats["wait_max_seconds"] = max(self._stats["wait_max_seconds"], wait)

    def _draw(self, k: int, as_numpy: bool):
        with self._mu:
            packs = dict(self._packs)
        plan = plan_draws(k, packs, self.policy, self.capacity, self._rng)
        rows, labels = [], []
        for (s, c), n in sorted(plan.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])):
            p = packs[s]
            idx = np.arange(len(p["labels"])) if c is None else np.flatnonzero(p["labels"] == c)
            # Distinct within one draw while the pack has enough; beyond that, with replacement.
            pick = self._rng.choice(idx, size=n, replace=n > len(idx))
            rows.append(p["samples"][pick])
            labels.append(p["labels"][pick])
            self._stats["local_draws" if s == self.shard else "remote_draws"] += n
        if rows:
            data, y = np.concatenate(rows), np.concatenate(labels)
            order = self._rng.permutation(len(y))
            data, y = data[order], y[order]
        else:
            data, y = np.zeros((0, self._sample_bytes), np.uint8), np.zeros(0, np.int64)
        x = np.ascontiguousarray(data).view(self.dtype).reshape((len(y),) + self.sample_shape)
        torch = _torch()
        if as_numpy or torch is None:
            return x, y
        return torch.from_numpy(x), torch.from_numpy(np.ascontiguousarray(y))

    def mix(self, x, y, ratio: Optional[float] = None, add: bool = True):
        """The new batch (x, y) followed by round(len(x) * ratio) samples drawn from the global
        buffer (waiting at most max_wait for the packs the previous call began to fetch); then
        (add=True) the new samples are offered to this rank's shard, a fresh pack of it is
        published, and the other shards' packs are fetched in the background for the next call.
        Returns torch tensors when x is one, else numpy arrays."""
        self._check_open("mix")
        t0 = time.perf_counter()
        r = self.ratio if ratio is None else _check.number("DistributedRehearsalBuffer.mix()", "ratio", ratio, lo=0.0)
        _check.boolean("DistributedRehearsalBuffer.mix()", "add", add)
        from .data import _same_length  # noqa: PLC0415 (data imports this module)
        _same_length("DistributedRehearsalBuffer.mix()", x, y)
        k = int(round(len(x) * r))
        torch = _torch()
        is_torch = torch is not None and isinstance(x, torch.Tensor)
        self._note_wait(self._await())  # the prefetch the previous call started
        old_x, old_y = self._draw(k, as_numpy=not is_torch) if k > 0 else (None, None)
        if add:
            self.local.add(x, y)
        self._publish()  # a fresh pack each step, also without add: another uniform subset
        self._prefetch()
        self._stats["mixes"] += 1
        if old_x is not None and len(old_y) > 0:
            if is_torch:
                y_t = y if isinstance(y, torch.Tensor) else torch.as_tensor(y)
                x, y = torch.cat([x, old_x.to(x.dtype)]), torch.cat([y_t, old_y.to(y_t.dtype)])
            else:
                x, y = np.concatenate([np.asarray(x), old_x]), np.concatenate([np.asarray(y), old_y])
        self._stats["mix_seconds"] += time.perf_counter() - t0
        return x, y

    # -- shard state -----------------------------------------------------------------------------

    def spill(self) -> None:
        """Writes this rank's shard to <spill_dir>/shard-<i> atomically."""
        self.local.spill()

    def state_dict(self) -> dict:
        """This rank's shard: RehearsalBuffer.state_dict() of the shard, plus format, shard, shards,
        and capacity (the global one)."""
        st = self.local.state_dict()
        st["shard_state"] = {"format": st.pop("format"), "capacity": st.pop("capacity")}
        st.update(format=self._STATE_FORMAT, shard=self.shard, shards=self.shards, capacity=self.capacity)
        return st

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores this rank's shard from a state_dict() of the same shard of as many shards;
        InvalidArgumentError naming what does not fit (the buffer unchanged then)."""
        owner = "DistributedRehearsalBuffer.load_state_dict()"
        _check.mapping(owner, "state", state, expected="a DistributedRehearsalBuffer.state_dict()")
        for key in ("format", "shard", "shards", "shard_state"):
            if key not in state:
                raise _viper.InvalidArgumentError(f"{owner}: state lacks {key}")
        if state["format"] != self._STATE_FORMAT:
            raise _viper.InvalidArgumentError(f"{owner}: state format={_check.shown(state['format'])}: must be "
                                              f"{self._STATE_FORMAT!r}")
        for key, mine in (("shard", self.shard), ("shards", self.shards)):
            if state[key] != mine:
                raise _viper.InvalidArgumentError(f"{owner}: state {key}={_check.shown(state[key])}: this buffer's is "
                                                  f"{mine} (each rank restores its own shard)")
        inner = {k: v for k, v in state.items() if k not in ("format", "shard", "shards", "shard_state", "capacity")}
        inner.update(state["shard_state"])
        self.local.load_state_dict(inner)
        self._publish()

    # -- introspection -----------------------------------------------------------------------------

    def __len__(self) -> int:
        """Samples this rank's shard holds."""
        return len(self.local)

    @property
    def seen(self) -> int:
        """Samples this rank's shard was offered."""
        return self.local.seen

    def shard_counts(self) -> Dict[int, dict]:
        """What this rank knows of every live shard from the latest packs: shard -> {seen,
        class_seen, class_held, held}."""
        with self._mu:
            return {s: {"seen": p["seen"], "class_seen": dict(p["class_seen"]), "class_held": dict(p["class_held"]),
                        "held": sum(p["class_held"].values())} for s, p in self._packs.items()}

    def stats(self) -> dict:
        """mixes; wait_seconds (in all) and wait_max_seconds: mix() blocked on a prefetch still in
        flight; mix_seconds: time in mix() in all; local_draws, remote_draws; fetches,
        fetch_failures, fetched_bytes, published_bytes; stale_packs (a fetch not done within
        max_wait); live (shards drawn from now) and down (shard -> why its fetch failed)."""
        with self._mu:
            st = dict(self._stats)
            st["live"] = sorted(self._packs)
            st["down"] = dict(self._down)
        return st

    def _check_open(self, call: str) -> None:
        if self._closed:  # (its packs are still at hand: draws would go on from a stale buffer)
            raise _viper.Error(f"DistributedRehearsalBuffer.{call}(): the buffer is closed")

    def close(self) -> None:
        """Stops the prefetch threads (waiting for fetches in flight) and closes the shard."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        self._inflight.clear()
        self._cache = None  # the node stops once its SampleCache is closed and dropped too
        self.local.close()


def _torch():
    try:
        import torch  # noqa: PLC0415
        return torch
    except ImportError:  # pragma: no cover
        return None
