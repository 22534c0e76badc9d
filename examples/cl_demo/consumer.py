"""Consumer: serves inference requests at a fixed rate and swaps in new model versions.

Run by run_demo.py:  consumer.py --config CFG.json --transport file|viper|none --out OUT.json
Request i is due at start + i * request_interval_s; it is a batch of request_batch fresh labelled
samples of the distribution at that drift time (drawn from a generator seeded by i, so every run
serves identical requests). Its loss is the batch's mean cross-entropy under the live version; the
consumer records loss, accuracy and the version that served it. CIL = the sum of the losses.

Two modules: `live` serves, `spare` receives the next version. A loader thread asks the transport
for a version newer than the live one, loads it into the spare, then swaps the two under a lock;
a request takes the live module under the same lock and uses it to the end, and the loader never
writes into a module a request still holds. So every request sees one whole version.
"""
from __future__ import annotations

import os
import sys
import threading
import time

_T0 = time.perf_counter()
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/

from cl_demo.runtime import (make_logger, memcpy_seconds, parse_role_args, set_torch_threads, sleep_until_ns,  # noqa: E402
                             tune_malloc, wait_for_start, write_json)

tune_malloc()

import torch  # noqa: E402

from cl_demo.config import DemoConfig  # noqa: E402
from cl_demo.data import DriftingStream, request_generator  # noqa: E402
from cl_demo.model import NT3Like, evaluate  # noqa: E402
from cl_demo.transports import Transport, make_transport  # noqa: E402


class DoubleBuffer:
    """The live module (with its version and step) and a spare; see the module docstring.

    Thread-safety: acquire/release from the serving thread, the rest from the loader thread.
    """

    def __init__(self, live: NT3Like, spare: NT3Like):
        self._cond = threading.Condition()
        self._live = (live, 0, 0)  # module, version, step
        self._spare = spare
        self._in_use = None

    def acquire(self):
        """(module, version, step) of the live version; hold it until release()."""
        with self._cond:
            self._in_use = self._live[0]
            return self._live

    def release(self) -> None:
        with self._cond:
            self._in_use = None
            self._cond.notify_all()

    def live_version(self) -> int:
        with self._cond:
            return self._live[1]

    def writable_spare(self) -> NT3Like:
        """The spare module, once no request still uses it (it was live until the last swap)."""
        with self._cond:
            while self._in_use is self._spare:
                self._cond.wait()
            return self._spare

    def swap(self, version: int, step: int) -> int:
        """Makes the spare live as (version, step); returns the time it went live (ns)."""
        with self._cond:
            old = self._live[0]
            self._live = (self._spare, version, step)
            self._spare = old
            return time.time_ns()


class Loader(threading.Thread):
    """Pulls new versions from the transport into the double buffer until stop is set."""

    def __init__(self, transport: Transport, buffers: DoubleBuffer):
        super().__init__(name="loader", daemon=True)
        self.transport = transport
        self.buffers = buffers
        self.stop = threading.Event()
        self.updates = []
        self.error = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                spare = self.buffers.writable_spare()
                update = self.transport.next_update(spare, self.buffers.live_version(), timeout_s=0.25)
                if update is None:
                    continue
                live_ns = self.buffers.swap(update.version, update.step)
                self.transport.served(update.version)
                self.updates.append({
                    "version": update.version, "step": update.step,
                    "completed_ns": update.completed_ns, "detected_ns": update.detected_ns,
                    "loaded_ns": update.loaded_ns, "live_ns": live_ns,
                    "transport_timings": update.transport_timings})
        except Exception:  # noqa: BLE001 (reported by the serving thread and in the results)
            self.error = traceback.format_exc()


def serve(cfg: DemoConfig, buffers: DoubleBuffer, start_ns: int, loader: Loader,
          stop: threading.Event | None = None) -> list:
    """Serves the requests due in [start, start + duration) (until `stop` is set); returns one row
    per request."""
    stream = DriftingStream(cfg.stream_config())
    count = int(cfg.duration_s / cfg.request_interval_s)
    rows = []
    for i in range(count):
        if stop is not None and stop.is_set():
            break
        if loader.error is not None:
            raise RuntimeError(f"consumer: the loader thread failed:\n{loader.error}")
        t_s = i * cfg.request_interval_s
        due_ns = start_ns + int(t_s * 1e9)
        sleep_until_ns(due_ns)
        x, y = stream.sample(cfg.request_batch, t_s, request_generator(cfg.data_seed, i))
        begin_ns = time.time_ns()
        module, version, step = buffers.acquire()
        try:
            loss, acc = evaluate(module, x, y)
        finally:
            buffers.release()
        rows.append([i, due_ns, begin_ns, time.time_ns(), version, step, loss, acc])
    return rows


def _watch_stdin_for_stop(stop: threading.Event) -> None:
    """The driver writes 'STOP' when the producer of a run bounded by iterations is done."""
    for line in sys.stdin:
        if line.strip() == "STOP":
            stop.set()
            return


_log = make_logger(__file__)


def main(argv=None) -> int:
    args = parse_role_args("consumer", __doc__, argv)

    cfg = DemoConfig.load(args.config)
    _log(f"imports done in {time.perf_counter() - _T0:.1f} s")
    set_torch_threads(torch, cfg.consumer_threads)
    live = NT3Like(cfg.model_config(), seed=cfg.train_seed, init_weights=False)
    live.load_state_dict(torch.load(cfg.init_path))
    spare = NT3Like(cfg.model_config(), seed=cfg.train_seed, init_weights=False)
    spare.load_state_dict(live.state_dict())
    live.eval()
    spare.eval()
    memcpy_s = memcpy_seconds(live.state_dict().values())  # the floor of a load, before and after the run
    transport = make_transport(args.transport, args.workdir, cfg)
    transport.start_consumer(deadline_ns=time.time_ns() + int(60e9))
    _log("ready")
    start_ns = wait_for_start(sys.stdin)
    buffers = DoubleBuffer(live, spare)
    loader = Loader(transport, buffers)
    loader.start()
    stop = threading.Event()
    threading.Thread(target=_watch_stdin_for_stop, args=(stop,), daemon=True).start()
    try:
        rows = serve(cfg, buffers, start_ns, loader, stop)
    finally:
        loader.stop.set()
        loader.join(timeout=30)
        transport.close()
    if loader.error is not None:
        raise RuntimeError(f"consumer: the loader thread failed:\n{loader.error}")
    memcpy_s += memcpy_seconds(live.state_dict().values())
    _log("done; writing results")
    write_json(args.out, {
        "transport": transport.describe(), "start_ns": start_ns, "threads": cfg.consumer_threads,
        "requests_header": ["index", "due_ns", "begin_ns", "end_ns", "version", "step", "loss", "acc"],
        "requests": rows, "updates": loader.updates, "memcpy_s": memcpy_s,
        "cil": sum(r[6] for r in rows)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
