"""Process-level helpers shared by the producer, the consumer and the driver."""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
import time

# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def tune_malloc() -> bool:
    """Keeps freed memory in the heap for reuse instead of returning it to the kernel.

    glibc serves every block above 32 MiB with a fresh mmap and unmaps it on free, so each training
    step's new gradient of the wide layer (hundreds of MB) and each torch.load buffer would fault in
    fresh pages (about 1.8 GB/s on these machines: 0.2 s per 400 MB). With mmap disabled, a large
    trim threshold and one arena, the next step reuses the pages the last one freed. Call before the
    first large allocation. Returns False (and changes nothing) where glibc's mallopt is missing.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok = libc.mallopt(_M_MMAP_MAX, 0) == 1
    ok &= libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    ok &= libc.mallopt(_M_ARENA_MAX, 1) == 1
    return bool(ok)


def memcpy_seconds(tensors, reps: int = 3) -> list:
    """Wall seconds of `reps` memcpy's of the bytes of `tensors` (e.g. a state_dict's values) into
    one buffer of their total size, which the first copy faults in: the physical floor of loading
    a version into a model, measured beside the loads it is compared with. Take the min (warm)."""
    import torch  # noqa: PLC0415 (the driver imports runtime before torch)
    parts = [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]
    buffer = torch.empty(sum(n for _, n in parts), dtype=torch.uint8)
    times = []
    for _ in range(reps + 1):  # the first faults the buffer in: not counted
        start = time.perf_counter()
        at = buffer.data_ptr()
        for address, n in parts:
            ctypes.memmove(at, address, n)
            at += n
        times.append(time.perf_counter() - start)
    return times[1:]


def set_torch_threads(torch_module, threads: int) -> None:
    """One intra-op thread count for torch (and, through OpenMP, for the OpenBLAS it calls; the
    driver also sets OMP_NUM_THREADS/OPENBLAS_NUM_THREADS for the pthread builds of OpenBLAS)."""
    torch_module.set_num_threads(threads)
    torch_module.set_num_interop_threads(1)


def sleep_until_ns(deadline_ns: int) -> None:
    """Sleeps until time.time_ns() >= deadline_ns (returns at once if it already is)."""
    while True:
        left = deadline_ns - time.time_ns()
        if left <= 0:
            return
        time.sleep(min(left / 1e9, 0.5))


def wait_for_start(stdin) -> int:
    """Tells the driver this process is ready and returns the shared start time it answers.

    Protocol: we print 'READY' on stdout; the driver writes one line 'START <ns>' (CLOCK_REALTIME
    ns, the same clock as time.time_ns() in every process of this host).
    """
    print("READY", flush=True)
    line = stdin.readline()
    parts = line.split()
    if len(parts) != 2 or parts[0] != "START" or not parts[1].isdigit():
        raise SystemExit(f"expected 'START <ns>' from the driver on stdin, got {line!r}")
    return int(parts[1])


def write_json(path: str, obj) -> None:
    """Writes obj as JSON atomically (tmp + rename), so a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, allow_nan=True)
    os.replace(tmp, path)


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def make_logger(script_path: str):
    """log(msg) for one process of the demo: "[HH:MM:SS <script name>] msg" on stderr."""
    name = os.path.basename(script_path)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} {name}] {msg}", file=sys.stderr, flush=True)
    return log


def parse_role_args(role: str, description: str, argv=None) -> argparse.Namespace:
    """The command line run_demo.py gives the producer and the consumer (`role`)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="DemoConfig JSON written by run_demo.py")
    ap.add_argument("--transport", required=True, choices=["none", "file", "viper"])
    ap.add_argument("--workdir", required=True, help="directory of this run (file transport: models/)")
    ap.add_argument("--out", required=True, help=f"where to write the {role}'s results JSON")
    return ap.parse_args(argv)
