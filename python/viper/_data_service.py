"""The data service of a node: one sample cache and the readers for every training process of the
host (viper.data.DataService, DataLoader(service=...), viper.data.ServiceControl, and
`python3 -m viper.data_service`).

The service owns a SampleCache whose node (in this process) keeps each sample once in the host
tier's shared memory, and per attached loader (a *stream*) a Prefetcher reading through that cache
with the stream's seed, rank and world size; the prefetcher's readers and read-ahead are the
stream's job's budget. A client asks for n samples and gets, per sample, the shared-memory segment,
offset and length of the cached copy, pinned (a read lease on the segment) until the client says it
is done with it: the client maps the segment read-only and its numpy arrays are views of the
cache, so no sample bytes cross the socket. Only a sample the cache cannot hold (its memory budget
is full) travels in the reply, and is counted (`inline_samples`).

Wire: TCP, each message a frame: u32 JSON length, u32 blob length (big-endian), the JSON object,
the blob (inline sample bytes). With a token, both ends prove they hold it, neither sending it: the
service's first frame carries its nonce, and the client's first request (`hello`) carries
`auth` = HMAC-SHA256(token, that nonce) in hex and a nonce of its own, which the service's reply
answers with `proof` = HMAC-SHA256(token, "viper-data service " + the client's nonce). A client
with a token refuses a service that does not prove it (a stranger on the port, or another token).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import mmap
import os
import secrets
import socket
import socketserver
import struct
import threading
import time
import weakref
from typing import Any, Optional

import numpy as np

from . import _viper
from . import _checks as _check
from . import _close_at_exit, _opened_elsewhere

PROTOCOL = 2
# Frame limits, per direction. A request is JSON only (its largest: an attach with a list of ids);
# a reply may carry samples the cache could not hold. The first frame of each side (the service's
# hello, the client's proof of the token) is small: a stranger who has not proven the token
# cannot make the service read more than that (before, it read up to 1 GiB into memory).
MAX_REQUEST_JSON = 16 << 20
MAX_REPLY_JSON = 16 << 20
MAX_REPLY_BLOB = 1 << 30
MAX_HANDSHAKE_JSON = 4096
# A connection must send its first request (with its proof of the token) within this many seconds;
# after that it may idle as long as it likes (a loader between epochs). Until then it is a stranger
# holding one of the service's threads.
HANDSHAKE_SECONDS = 5.0
MAX_READERS = 1024
MIN_MEMORY = 1 << 20  # a job's read-ahead budget: at least 1 MiB
_HEADER = struct.Struct(">II")


class ServiceError(_viper.Error):
    """The data service refused a request or could not be reached (the message says which)."""


def _client_proof(token: str, service_nonce: Any) -> str:
    return hmac.new(token.encode(), str(service_nonce).encode(), hashlib.sha256).hexdigest()


def _service_proof(token: str, client_nonce: Any) -> str:
    # Another message than the client's: a proof one side sent never passes for the other's.
    return hmac.new(token.encode(), b"viper-data service " + str(client_nonce).encode(), hashlib.sha256).hexdigest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        b = sock.recv(min(n - got, 1 << 20))
        if not b:
            raise ConnectionError("connection closed")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def _send(sock: socket.socket, obj: dict, blob: bytes | memoryview = b"", max_json: int = MAX_REPLY_JSON) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    if len(data) > max_json:  # refused here, with the reason, rather than by the peer with a close
        raise _viper.InvalidArgumentError(f"{len(data)} bytes of JSON, over the data service's limit of {max_json}")
    sock.sendall(_HEADER.pack(len(data), len(blob)) + data)
    if len(blob):
        sock.sendall(blob)


def _recv(sock: socket.socket, max_json: int, max_blob: int) -> tuple[dict, bytes]:
    """One frame, refused (ConnectionError) from its header alone when it is over the limits: none
    of its bytes are read. Malformed JSON raises ValueError (RecursionError when nested too deep)."""
    n, m = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if n > max_json or m > max_blob:
        raise ConnectionError(f"frame of {n} + {m} bytes is over the limit of {max_json} + {max_blob}")
    obj = json.loads(_recv_exact(sock, n))
    if not isinstance(obj, dict):
        raise ConnectionError("frame is not a JSON object")
    return obj, (_recv_exact(sock, m) if m else b"")


def _release(req: dict, pins: dict) -> None:
    """Drops the pins a request releases (its "release": a list of pin numbers this connection got)."""
    release = req.get("release", [])
    if not isinstance(release, list):
        raise TypeError(f"release={_check.shown(release)}: expected a list of pin numbers")
    for p in release:
        pins.pop(_check.integer("release", "pin", p), None)


def _split_address(owner: str, name: str, value: Any) -> tuple[str, int]:
    value = _check.address(owner, name, value)
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _rss() -> dict:
    out = {"rss_bytes": 0, "rss_anon_bytes": 0, "rss_shmem_bytes": 0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                field = {"VmRSS": "rss_bytes", "RssAnon": "rss_anon_bytes", "RssShmem": "rss_shmem_bytes"}.get(key)
                if field:
                    out[field] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


# ---------------------------------------------------------------- budgets


def check_budget(owner: str, readers: Any = None, memory: Any = None,
                 names: tuple[str, str] = ("readers", "memory")) -> tuple[Optional[int], Optional[int]]:
    """(readers, memory) of a job's budget, checked: readers an int in [1, 1024] (reader threads),
    memory an int >= 1 MiB (bytes read ahead); None leaves that part as it is."""
    if readers is not None:
        readers = _check.integer(owner, names[0], readers, lo=1, hi=MAX_READERS)
    if memory is not None:
        memory = _check.integer(owner, names[1], memory, lo=MIN_MEMORY)
    return readers, memory


class _Stream:
    """One attached loader: its prefetcher (over the job's counted view of the cache)."""

    def __init__(self, sid: int, job: "_Job", prefetcher, pid: int, rank: int, world_size: int):
        self.id, self.job, self.prefetcher = sid, job, prefetcher
        self.pid, self.rank, self.world_size = pid, rank, world_size
        self.delivered = 0
        self.delivered_bytes = 0
        self.inline_samples = 0
        self.epochs_done = 0


class _Job:
    def __init__(self, name: str, readers: int, memory: int, view, counters):
        self.name = name
        self.readers, self.memory = readers, memory
        self.view, self.counters = view, counters
        self.streams: dict[int, _Stream] = {}
        self.closed = {"delivered": 0, "delivered_bytes": 0, "inline_samples": 0, "wait_seconds": 0.0,
                       "peak_buffered_bytes": 0}
        self.created = time.time()

    def share(self) -> tuple[int, int]:
        """Each stream's part of the job's budget (the job's readers and memory split evenly)."""
        n = max(1, len(self.streams))
        return max(1, self.readers // n), max(1, self.memory // n)

    def apply(self) -> None:
        readers, memory = self.share()
        for s in list(self.streams.values()):
            s.prefetcher._impl.set_limits(readers, memory)


class DataService:
    """The data service of this host: a sample cache in shared memory (a viper node's host tier,
    started here) and the reader threads, for every training process of the host that attaches
    with DataLoader(source, ..., service="HOST:PORT").

    `source`: what every attached job reads (a path, a Source, or callable_source). `listen`: the
    control address (TCP "HOST:PORT"; port 0 picks one: see .address). `node`: the cache node's
    UCX address (loopback by default; only this process and ranks of other nodes talk to it).
    `max_bytes`: the cache's memory (shared memory; 0 = half of /dev/shm); `max_samples`: samples it
    may hold (0: as many as vm.max_map_count allows). `job_readers`, `job_memory`: the budget a job gets when it first attaches (reader
    threads; bytes read ahead); change it at run time with set_budget(), ServiceControl or
    `viper data set-budget`. `token`: the clients' shared secret, required to listen beyond loopback
    unless insecure=True. `name`: the cache's namespace in the node."""

    def __init__(self, source, listen: str = "127.0.0.1:0", *, node: str = "127.0.0.1:0", max_bytes: int = 0,
                 max_samples: int = 0, job_readers: int = 4, job_memory: int = 64 << 20, token: str = "",
                 insecure: bool = False, name: str = "data"):
        from . import data as _data
        owner = "viper.data.DataService()"
        host, port = _split_address(owner, "listen", listen)
        _check.address(owner, "node", node)
        max_bytes = _check.integer(owner, "max_bytes", max_bytes, lo=0)
        max_samples = _check.integer(owner, "max_samples", max_samples, lo=0)
        job_readers, job_memory = check_budget(owner, job_readers, job_memory, ("job_readers", "job_memory"))
        self._defaults = (job_readers, job_memory)
        self._token = _check.text(owner, "token", token, allow_empty=True)
        insecure = _check.boolean(owner, "insecure", insecure)
        if not _is_loopback(host) and not self._token and not insecure:
            raise _viper.InvalidArgumentError(
                f"{owner}: listen={listen!r}: listening beyond loopback needs a token (or insecure=True)")
        self.cache = _data.SampleCache(source, [node], 0, name=name, token=self._token, insecure=insecure,
                                       max_bytes=max_bytes, max_samples=max_samples)
        self.source = self.cache.base
        self._mu = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._budgets: dict[str, tuple[int, int]] = {}  # set for a job before it attached, or kept after
        self._next_stream = 1
        self._gone = {"source_bytes": 0, "source_reads": 0, "cache_hits": 0}  # of jobs that ended
        self._ended_jobs: list[dict] = []
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._started = time.time()
        service = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):  # noqa: D401 (one connection)
                service._serve_connection(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        try:
            self._server = Server((host, port), Handler)
        except OSError as e:
            self.cache.close()
            raise ServiceError(f"{owner}: listen={listen!r}: cannot listen there: {e.strerror}") from None
        self._thread = threading.Thread(target=self._server.serve_forever, name="viper-data-service", daemon=True)
        self._thread.start()
        # Closed at exit while its daemon threads still run: left to interpreter shutdown, a loader
        # of this process waited forever for their answer to its detach, and the cache's segments
        # stayed in /dev/shm.
        _close_at_exit(self)

    @property
    def address(self) -> str:
        if self._server is None:
            raise ServiceError("DataService is closed")
        host, port = self._server.server_address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    # ------------------------------------------------------------ control plane (also over the wire)

    def set_budget(self, job: str, readers: Optional[int] = None, memory: Optional[int] = None) -> dict:
        """Sets job's reader and memory budget now (its streams' tuners work within it from their
        next window; readers above it stop after their current read). A job not attached yet gets
        it when it attaches. Returns the job's budget."""
        owner = "DataService.set_budget()"
        job = _check.text(owner, "job", job)
        readers, memory = check_budget(owner, readers, memory)
        if readers is None and memory is None:
            raise _viper.InvalidArgumentError(f"{owner}: give readers, memory or both")
        with self._mu:
            j = self._jobs.get(job)
            cur = (j.readers, j.memory) if j is not None else self._budgets.get(job, self._defaults)
            new = (readers if readers is not None else cur[0], memory if memory is not None else cur[1])
            self._budgets[job] = new
            if j is not None:
                j.readers, j.memory = new
                j.apply()
        return {"job": job, "readers": new[0], "memory": new[1]}

    def jobs(self) -> list:
        """The jobs attached now: name, budget (readers, memory), streams (pid, rank, world_size),
        and the readers and bytes read ahead now."""
        with self._mu:
            out = []
            for j in self._jobs.values():
                streams, readers, buffered = [], 0, 0
                for s in j.streams.values():
                    st = s.prefetcher.stats()
                    readers += st["readers"]
                    buffered += st["buffered_bytes"]
                    streams.append({"stream": s.id, "pid": s.pid, "rank": s.rank, "world_size": s.world_size})
                out.append({"job": j.name, "budget": {"readers": j.readers, "memory": j.memory},
                            "streams": streams, "readers": readers, "buffered_bytes": buffered})
            return out

    def stats(self) -> dict:
        """Per job: wait_seconds (time its readers kept a request waiting), cache_hits and
        cache_hit_bytes, source_reads and source_bytes (read from the source for it), delivered and
        delivered_bytes, inline_samples (sent through the socket: not in the cache), readers and
        buffered_bytes now, peak_buffered_bytes, budget. The service: cache (the SampleCache's
        stats: node_bytes is the shared memory it holds), totals over jobs (ended ones included:
        their source bytes add up to the cache's), and this process's memory (rss_bytes,
        rss_anon_bytes, rss_shmem_bytes)."""
        with self._mu:
            jobs = {}
            total = dict(self._gone)
            for j in self._jobs.values():
                c = j.counters.stats()
                d = {"budget": {"readers": j.readers, "memory": j.memory}, "streams": len(j.streams),
                     "cache_hits": c["cache_hits"], "cache_hit_bytes": c["cache_hit_bytes"],
                     "source_reads": c["source_reads"], "source_bytes": c["source_bytes"]}
                d.update({k: v for k, v in j.closed.items()})
                d["readers"] = d["buffered_bytes"] = 0
                for s in j.streams.values():
                    st = s.prefetcher.stats()
                    d["wait_seconds"] += st["consumer_wait_seconds"]
                    d["readers"] += st["readers"]
                    d["buffered_bytes"] += st["buffered_bytes"]
                    d["peak_buffered_bytes"] = max(d["peak_buffered_bytes"], st["peak_buffered_bytes"])
                    d["delivered"] += s.delivered
                    d["delivered_bytes"] += s.delivered_bytes
                    d["inline_samples"] += s.inline_samples
                jobs[j.name] = d
                for k in ("source_bytes", "source_reads", "cache_hits"):
                    total[k] += d[k]
        out = {"jobs": jobs, "ended_jobs": list(self._ended_jobs), "total": total, "cache": self.cache.stats(),
               "uptime_seconds": time.time() - self._started}
        out.update(_rss())
        return out

    # ------------------------------------------------------------ the wire

    def _serve_connection(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._mu:
            self._conns[sock] = threading.current_thread()
        nonce = secrets.token_hex(16)
        pins: dict[int, Any] = {}
        streams: list[_Stream] = []
        next_pin = 1
        try:
            sock.settimeout(HANDSHAKE_SECONDS)
            _send(sock, {"service": "viper-data", "protocol": PROTOCOL, "nonce": nonce})
            req, _ = _recv(sock, MAX_HANDSHAKE_JSON, 0)
            proof = None
            if self._token:
                if not hmac.compare_digest(str(req.get("auth", "")), _client_proof(self._token, nonce)):
                    _send(sock, {"error": "unauthenticated: wrong or missing token"})
                    return
                proof = _service_proof(self._token, req.get("nonce", ""))
            sock.settimeout(None)
            while True:
                op = req.get("op")
                try:
                    if op == "next":
                        reply, blob, next_pin = self._next(req, streams, pins, next_pin)
                        _send(sock, reply, blob)
                    else:
                        _release(req, pins)
                        reply = self._control(op, req, streams)
                        if op == "hello" and proof:
                            reply["proof"] = proof
                        _send(sock, reply)
                except (_viper.Error, TypeError, ValueError, KeyError, OverflowError) as e:
                    _send(sock, {"error": str(e)})
                req, _ = _recv(sock, MAX_REQUEST_JSON, 0)
        except (ConnectionError, OSError, ValueError, RecursionError, struct.error):
            pass  # the client went away (or spoke garbage): drop what it held
        finally:
            pins.clear()
            for s in streams:
                self._detach(s)
            with self._mu:
                self._conns.pop(sock, None)

    def _control(self, op: Any, req: dict, streams: list) -> dict:
        if op == "hello":
            return {"ok": True, "node": self.cache.address, "pid": os.getpid(), "samples": len(self.source)}
        if op == "attach":
            s = self._attach(req)
            streams.append(s)
            return {"ok": True, "stream": s.id, "epoch_size": s.prefetcher.epoch_size, "samples": len(self.source)}
        if op == "detach":
            sid = _check.integer("detach", "stream", req.get("stream"))
            for s in [s for s in streams if s.id == sid]:
                streams.remove(s)
                self._detach(s)
            return {"ok": True}
        if op == "release":
            return {"ok": True}
        if op == "jobs":
            return {"ok": True, "jobs": self.jobs()}
        if op == "stats":
            return {"ok": True, "stats": self.stats()}
        if op == "set_budget":
            return {"ok": True, "budget": self.set_budget(req.get("job"), req.get("readers"), req.get("memory"))}
        raise _viper.InvalidArgumentError(f"op={_check.shown(op)}: not a request of this service")

    def _attach(self, req: dict) -> _Stream:
        from . import data as _data
        owner = "attach"
        job_name = _check.text(owner, "job", req.get("job"))
        options = req.get("options") or {}
        if not isinstance(options, dict):
            raise TypeError(f"{owner}: options: expected an object")
        allowed = {"seed", "shuffle", "ordered", "rank", "world_size", "epochs", "on_error", "autotune",
                   "readers", "buffer_samples", "tune_interval"}
        for k in options:
            if k not in allowed:
                raise _viper.InvalidArgumentError(f"{owner}: option {k!r} is not one a service stream takes "
                                                  f"({', '.join(sorted(allowed))})")
        ids = req.get("ids")
        with self._mu:
            j = self._jobs.get(job_name)
            if j is None:
                readers, memory = self._budgets.get(job_name, self._defaults)
                view, counters = self.cache._cache.job_view()
                j = _Job(job_name, readers, memory, view, counters)
                self._jobs[job_name] = j
            sid = self._next_stream
            self._next_stream += 1
            n = len(j.streams) + 1
            readers, memory = max(1, j.readers // n), max(1, j.memory // n)
        opts = dict(options)
        opts.setdefault("epochs", 0)
        opts["max_readers"] = readers
        opts["max_buffer_bytes"] = memory
        opts["readers"] = min(int(opts.get("readers", min(2, readers))), readers)
        src = _data.Source(j.view, self.cache._reopen)
        try:
            p = _data.Prefetcher(src, ids=ids, **opts)
        except BaseException:
            with self._mu:
                if not j.streams and self._jobs.get(job_name) is j:
                    del self._jobs[job_name]
            raise
        s = _Stream(sid, j, p, _check.integer(owner, "pid", req.get("pid", 0)), int(opts.get("rank", 0)),
                    int(opts.get("world_size", 1)))
        with self._mu:
            j.streams[sid] = s
            j.apply()
        return s

    def _detach(self, s: _Stream) -> None:
        # Out of the job, its counters into the job's, under the lock (jobs() and stats() read every
        # listed stream's prefetcher), and only then its prefetcher closed.
        try:
            self._retire(s)
        finally:
            s.prefetcher.close()

    def _retire(self, s: _Stream) -> None:
        with self._mu:
            j = s.job
            if j.streams.pop(s.id, None) is None:
                return
            st = s.prefetcher.stats()
            c = j.closed
            c["delivered"] += s.delivered
            c["delivered_bytes"] += s.delivered_bytes
            c["inline_samples"] += s.inline_samples
            c["wait_seconds"] += st["consumer_wait_seconds"]
            c["peak_buffered_bytes"] = max(c["peak_buffered_bytes"], st["peak_buffered_bytes"])
            if j.streams:
                j.apply()
                return
            del self._jobs[j.name]
            counts = j.counters.stats()
            for k in ("source_bytes", "source_reads", "cache_hits"):
                self._gone[k] += counts[k]
            self._budgets.setdefault(j.name, (j.readers, j.memory))
            ended = dict(c, job=j.name, **counts)
            self._ended_jobs = (self._ended_jobs + [ended])[-100:]

    def _next(self, req: dict, streams: list, pins: dict, next_pin: int):
        _release(req, pins)
        sid = _check.integer("next", "stream", req.get("stream"))
        s = next((x for x in streams if x.id == sid), None)
        if s is None:
            raise _viper.InvalidArgumentError(f"stream={sid}: not attached on this connection")
        n = _check.integer("next", "n", req.get("n"), lo=1, hi=1 << 16)
        batch = s.prefetcher.next_batch(n, stack=False)
        if batch is None:
            s.epochs_done += 1
            return {"ok": True, "end": True}, b"", next_pin
        samples, blobs, at = [], [], 0
        for array, label, sample_id in batch:
            pinned = self.cache._cache.pin(int(sample_id))
            nbytes = int(array.nbytes)
            if pinned is not None:
                segment, offset, size, hold = pinned
                pins[next_pin] = hold
                samples.append([int(sample_id), int(label), segment, int(offset), int(size), next_pin])
                next_pin += 1
            else:  # the cache could not hold it: the bytes travel in the reply
                samples.append([int(sample_id), int(label), None, at, nbytes, 0])
                blobs.append(array.tobytes())
                at += nbytes
                s.inline_samples += 1
            s.delivered += 1
            s.delivered_bytes += nbytes
        return {"ok": True, "samples": samples}, b"".join(blobs), next_pin

    def close(self) -> None:
        """Stops serving (attached loaders get an error at their next request) and the cache node."""
        if getattr(self, "_server", None) is None:
            return
        if _opened_elsewhere(self):  # a forked child: the server, its threads and clients are the parent's
            self._server = None
            self.cache.close()  # forgets the node
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        with self._mu:
            conns = dict(self._conns)
        # Each connection's thread drops its pins and closes its streams' prefetchers itself (never
        # another thread: one may be inside its prefetcher's next_batch), once its socket fails.
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in conns.values():
            thread.join(timeout=10)
        self.cache.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------- client side


class _Connection:
    def __init__(self, owner: str, address: str, token: str, timeout: float):
        host, port = _split_address(owner, "service", address)
        self.address = address
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise ServiceError(f"{owner}: service={address!r}: cannot connect: {e.strerror or e}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lock = threading.Lock()
        self.broken = ""  # why a request was cut short (then the connection is closed)
        try:  # within `timeout`, as the connect: a peer that accepts and says nothing is not a service
            hello, _ = _recv(self.sock, MAX_HANDSHAKE_JSON, 0)
        except (OSError, ConnectionError, ValueError) as e:
            self.close()
            raise ServiceError(f"{owner}: service={address!r}: not a viper data service ({e})") from None
        if hello.get("service") != "viper-data" or hello.get("protocol") != PROTOCOL:
            self.close()
            raise ServiceError(f"{owner}: service={address!r}: not a viper data service of protocol {PROTOCOL}")
        nonce = secrets.token_hex(16)
        req = {"op": "hello", "auth": _client_proof(token, hello.get("nonce", "")) if token else "", "nonce": nonce}
        try:
            self.info = self.call(req, owner, handshake=True)[0]
            if token and not hmac.compare_digest(str(self.info.get("proof", "")), _service_proof(token, nonce)):
                raise ServiceError(f"{owner}: service={address!r} did not prove that it holds the token: not the "
                                   "service meant (another process on its port), or one with another token or none")
        except ServiceError:
            self.close()
            raise
        self.sock.settimeout(None)  # then a request may wait as long as its samples take

    def call(self, req: dict, owner: str, handshake: bool = False) -> tuple[dict, bytes]:
        """`handshake`: the reply to the hello, from a service not proven yet: as small as a hello."""
        max_json, max_blob = (MAX_HANDSHAKE_JSON, 0) if handshake else (MAX_REPLY_JSON, MAX_REPLY_BLOB)
        with self.lock:
            if self.broken:
                raise ServiceError(f"{owner}: the connection to the data service at {self.address} was cut "
                                   f"mid-request ({self.broken}); open a new one")
            try:
                _send(self.sock, req, max_json=MAX_REQUEST_JSON)
            except _viper.InvalidArgumentError as e:  # over the limit: nothing was sent, the stream is in step
                raise _viper.InvalidArgumentError(f"{owner}: a request of {e} (an attach with fewer ids)") from None
            except (OSError, ValueError) as e:
                self._break(str(e))
                raise ServiceError(f"{owner}: the data service at {self.address} is gone ({e})") from None
            except BaseException as e:
                self._break(type(e).__name__)
                raise
            try:
                reply, blob = _recv(self.sock, max_json, max_blob)
            except (OSError, ConnectionError, ValueError, RecursionError) as e:
                self._break(str(e))
                raise ServiceError(f"{owner}: the data service at {self.address} is gone ({e})") from None
            except BaseException as e:  # KeyboardInterrupt mid-request: its reply would answer the next
                self._break(type(e).__name__)
                raise
        if "error" in reply:
            raise ServiceError(f"{owner}: the data service at {self.address} refused: {reply['error']}")
        return reply, blob

    def _break(self, why: str) -> None:
        """A request left half done: the stream is out of step, so nothing more is sent on it (the
        service drops this connection's pins and streams when it sees the close)."""
        self.broken = why
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class ServiceControl:
    """The control plane of a data service at `address` ("HOST:PORT"): jobs(), set_budget(),
    stats(). The same as `viper data jobs|set-budget|stats --node HOST:PORT`."""

    def __init__(self, address: str, *, token: str = "", timeout: float = 10.0):
        owner = "viper.data.ServiceControl()"
        token = _check.text(owner, "token", token, allow_empty=True)
        timeout = _check.seconds(owner, "timeout", timeout, lo_open=True)
        self._conn = _Connection(owner, address, token, timeout)

    def jobs(self) -> list:
        return self._conn.call({"op": "jobs"}, "ServiceControl.jobs()")[0]["jobs"]

    def stats(self) -> dict:
        return self._conn.call({"op": "stats"}, "ServiceControl.stats()")[0]["stats"]

    def set_budget(self, job: str, readers: Optional[int] = None, memory: Optional[int] = None) -> dict:
        owner = "ServiceControl.set_budget()"
        job = _check.text(owner, "job", job)
        readers, memory = check_budget(owner, readers, memory)
        if readers is None and memory is None:
            raise _viper.InvalidArgumentError(f"{owner}: give readers, memory or both")
        req = {"op": "set_budget", "job": job}
        if readers is not None:
            req["readers"] = readers
        if memory is not None:
            req["memory"] = memory
        return self._conn.call(req, owner)[0]["budget"]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Segments:
    """Read-only mappings of the service's segments, by name (a name is never reused: pid.seq),
    the most recently used kept."""

    def __init__(self, keep: int = 512):
        self.keep = keep
        self.maps: dict[str, mmap.mmap] = {}

    def get(self, name: str) -> mmap.mmap:
        m = self.maps.pop(name, None)
        if m is None:
            if not name or "/" in name or name.startswith("."):
                raise ServiceError(f"the data service named segment {name!r}: not a segment name")
            fd = os.open("/dev/shm/" + name, os.O_RDONLY | os.O_CLOEXEC)
            try:
                m = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            while len(self.maps) >= self.keep:  # unmapped once no array uses it any more
                self.maps.pop(next(iter(self.maps)))
        self.maps[name] = m
        return m


class ServiceStream:
    """One loader's stream from a data service (what DataLoader(service=...) reads): next_batch
    as Prefetcher.next_batch. Arrays of stack=False are read-only views of the service's shared
    memory, valid until this stream is closed."""

    def __init__(self, address: str, *, job: str, token: str = "", ids=None, timeout: float = 10.0, **options):
        owner = "viper.data.DataLoader()"
        self._conn = _Connection(owner, address, token, timeout)
        req = {"op": "attach", "job": job, "pid": os.getpid(), "options": options}
        try:
            if ids is not None:
                req["ids"] = [int(i) for i in ids]
            reply, _ = self._conn.call(req, owner)
        except BaseException:
            self._conn.close()
            raise
        self.stream = reply["stream"]
        self.epoch_size = reply["epoch_size"]
        self.samples = reply["samples"]
        self.node = self._conn.info.get("node")
        self._segments = _Segments()
        self._release: list[int] = []
        self._release_lock = threading.Lock()
        self.wait_seconds = 0.0
        self.requests = 0
        self.mapped_samples = 0
        self.inline_samples = 0
        self._pid = os.getpid()

    def _take_release(self) -> list:
        with self._release_lock:
            out, self._release = self._release, []
        return out

    def _queue_release(self, pin: int) -> None:
        with self._release_lock:
            self._release.append(pin)

    def next_batch(self, n: int, stack: bool = True):
        t0 = time.perf_counter()
        owner = "DataLoader: next batch"
        reply, blob = self._live(owner).call({"op": "next", "stream": self.stream, "n": int(n),
                                              "release": self._take_release()}, owner)
        self.wait_seconds += time.perf_counter() - t0
        self.requests += 1
        if reply.get("end"):
            return None
        samples = reply["samples"]
        views, held = [], []
        for sample_id, label, segment, offset, nbytes, pin in samples:
            if segment is None:
                views.append(np.frombuffer(blob, dtype=np.uint8, count=nbytes, offset=offset))
                self.inline_samples += 1
            else:
                views.append(np.frombuffer(self._segments.get(segment), dtype=np.uint8, count=nbytes, offset=offset))
                self.mapped_samples += 1
            held.append(pin)
        labels = np.array([s[1] for s in samples], dtype=np.int64)
        ids = np.array([s[0] for s in samples], dtype=np.uint64)
        if stack:
            size = views[0].nbytes
            for v in views:
                if v.nbytes != size:
                    raise _viper.InvalidArgumentError(
                        f"next_batch(stack=True): samples of {size} and {v.nbytes} bytes cannot be stacked; "
                        "use stack=False")
            data = np.empty((len(views), size), dtype=np.uint8)
            for i, v in enumerate(views):
                data[i] = v
            with self._release_lock:
                self._release.extend(p for p in held if p)
            return data, labels, ids
        out = []
        for v, label, sample_id, pin in zip(views, labels, ids, held):
            if pin:
                weakref.finalize(v, self._queue_release, pin)
            out.append((v, int(label), int(sample_id)))
        return out

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            try:
                self._conn.call({"op": "detach", "stream": self.stream, "release": self._take_release()},
                                "DataLoader.close()")
            except ServiceError:
                pass
            self._conn.close()
        self._conn = None

    def stats(self) -> dict:
        return {"wait_seconds": self.wait_seconds, "requests": self.requests, "mapped_samples": self.mapped_samples,
                "inline_samples": self.inline_samples}

    def service_stats(self) -> dict:
        return self._live("DataLoader.stats()").call({"op": "stats"}, "DataLoader.stats()")[0]["stats"]

    def _live(self, owner: str) -> _Connection:
        if self._conn is None:
            raise ServiceError(f"{owner}: the stream from the data service is closed")
        return self._conn
