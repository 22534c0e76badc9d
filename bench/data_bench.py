#!/usr/bin/python3
"""The data side's benchmark (docs/BENCHMARKS.md "Data loader"): how long a training loop
waits for its next batch with viper.data's auto-tuned prefetcher, against torch's DataLoader, in
the same run, on the same files, with the files evicted from the page cache before every run.

    flock /tmp/viper-bench.lock /usr/bin/python3 bench/data_bench.py --dir /tmp/viper-data-bench

Data set: --gb (2) GB of --file-kb (128) KiB files in 16 class directories under --dir, made once
and reused (never in the repository). Every run reads the same --steps x --batch samples (a
fixed random subset, shuffled), cold: before each run every file of the data set is dropped from
the page cache (posix_fadvise DONTNEED, checked with fincore; --evict drop drops the whole cache
instead, as root).

The training loop: next(batch) (timed: the wait), then the step: one pass over the batch's bytes
on the CPU (a sum of its bytes as int64 words, ~2 ms for 4 MiB: the host's share) and --step-ms of sleep (the accelerator's share, during
which the CPU is free, as with a GPU).

Runs, each in its own process (its proportional memory, PSS, summed over the process and its
workers, is sampled every 50 ms):
  torch    torch.utils.data.DataLoader over a map-style Dataset that reads a file per sample
           (np.fromfile), num_workers in --workers (0,1,2,4,8), prefetch_factor 2, default collate;
  viper    viper.data.DataLoader, fixed readers in --readers (1,2,4,8,16,32), autotune off,
           buffer as many samples as the memory below holds; and auto: autotune on from the
           default start (2 readers, 16 samples).
           Both with max_buffer_bytes = the in-flight bytes of the best torch setting
           (num_workers x prefetch_factor batches; one batch for num_workers 0): the same memory.
Physical baseline: the same samples read cold by 16 plain threads (no training loop), MB/s.

Figures: wait per step (mean over every step, the first batch included, and p95), throughput,
peak PSS; ratios: best torch wait / viper auto wait (target >= 2), viper auto time per step /
best fixed viper (target <= 1.10). Results also go to --json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

CLASSES = 16
HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- data set and page cache

def dataset_files(root: str, gb: float, file_kb: int) -> list:
    """The data set's files (made on first use; a MANIFEST marks it complete)."""
    size = file_kb * 1024
    count = int(gb * 1e9 // size) + 1
    manifest = os.path.join(root, "MANIFEST")
    want = f"{count} {size}\n"
    paths = [os.path.join(root, f"c{i % CLASSES:02d}", f"{i:07d}.bin") for i in range(count)]
    if os.path.exists(manifest) and open(manifest).read() == want:
        return paths
    print(f"making the data set: {count} files of {file_kb} KiB ({count * size / 1e9:.2f} GB) in {root}", flush=True)
    if os.path.exists(root):
        shutil.rmtree(root)
    for c in range(CLASSES):
        os.makedirs(os.path.join(root, f"c{c:02d}"))
    import numpy as np
    block = np.random.default_rng(17).integers(0, 256, size=size + 8192, dtype=np.uint8).tobytes()
    for i, path in enumerate(paths):
        with open(path, "wb") as f:
            f.write(block[i % 8192:i % 8192 + size])  # distinct contents, no compression tricks
    os.sync()
    with open(manifest, "w") as f:
        f.write(want)
    return paths


def evict(paths: list, mode: str) -> None:
    if mode == "none":
        return
    if mode == "drop":
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def resident_bytes(paths: list) -> int:
    """Page-cache bytes of a sample of `paths` (fincore), scaled to all of them."""
    sample = paths[:: max(1, len(paths) // 200)]
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *sample], capture_output=True,
                         text=True, check=True).stdout.split()
    return int(sum(int(v) for v in out) * len(paths) / len(sample))


def disk_baseline(paths: list, threads: int = 16) -> float:
    """MB/s of reading `paths` cold with `threads` plain threads."""
    def read(p):
        with open(p, "rb", buffering=0) as f:
            return len(f.read())
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        total = sum(ex.map(read, paths))
    return total / (time.perf_counter() - t0) / 1e6


# ---------------------------------------------------------------- one run (in its own process)

def run_one(cfg: dict) -> dict:
    import torch
    torch.set_num_threads(1)
    paths, ids, batch, steps = cfg["paths"], cfg["ids"], cfg["batch"], cfg["steps"]
    if cfg["kind"] == "torch":
        loader = torch_loader(paths, ids, batch, cfg["workers"], cfg["prefetch_factor"], cfg["seed"])
    else:
        loader = viper_loader(cfg, ids)
    step_s = cfg["step_ms"] / 1000
    waits = []
    checksum = 0
    cpu0 = _cpu_seconds()
    t_start = time.perf_counter()
    it = iter(loader)
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = next(it)
        waits.append(time.perf_counter() - t0)
        checksum += int(x.reshape(-1).view(torch.int64).sum())  # the host's pass over the batch
        time.sleep(step_s)        # the accelerator's share
    total = time.perf_counter() - t_start
    out = {"waits": waits, "total_s": total, "checksum": checksum}
    if cfg["kind"] == "viper":
        stats = loader.stats()
        out["readers_end"], out["buffer_end"] = stats["readers"], stats["buffer_samples"]
        out["tuner"] = [(round(e["at_seconds"], 2), e["readers"], e["buffer_samples"]) for e in stats["tuner"]]
        out["peak_buffered_bytes"] = stats["peak_buffered_bytes"]
        loader.close()
    del it, loader  # torch joins its workers here, so that their CPU time is counted below
    import gc
    gc.collect()
    out["cpu_s"] = _cpu_seconds() - cpu0
    return out


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that have exited (torch's workers)."""
    cpu = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return sum(u.ru_utime + u.ru_stime for u in cpu)


class FileDataset:
    """What users write today: one file per sample, read whole into a numpy array."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import numpy as np
        import torch
        return torch.from_numpy(np.fromfile(self.paths[i], dtype=np.uint8)), i % CLASSES


def torch_loader(paths, ids, batch, workers, prefetch_factor, seed):
    import torch
    import torch.utils.data as td
    g = torch.Generator()
    g.manual_seed(seed)
    kwargs = dict(batch_size=batch, sampler=td.SubsetRandomSampler(ids, generator=g), num_workers=workers)
    if workers > 0:
        kwargs["prefetch_factor"] = prefetch_factor
    return td.DataLoader(FileDataset(paths), **kwargs)


def viper_loader(cfg, ids):
    import viper.data as vd
    source = vd.open_source(cfg["dir"], extensions=[".bin"])
    return vd.DataLoader(source, batch_size=cfg["batch"], ids=ids, seed=cfg["seed"], max_buffer_bytes=cfg["cap_bytes"],
                         autotune=cfg["autotune"], readers=cfg["readers"], buffer_samples=cfg["buffer_samples"])


# ---------------------------------------------------------------- the parent: runs and report

def tree_pss(pid: int) -> int:
    import psutil
    total = 0
    try:
        proc = psutil.Process(pid)
        for p in [proc] + proc.children(recursive=True):
            try:
                total += p.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    except psutil.NoSuchProcess:
        pass
    return total


def measure(cfg: dict, args, paths: list) -> dict:
    evict(paths, args.evict)
    resident = resident_bytes(paths) if args.evict != "none" else -1
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--run-one", "-"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.wait(0.05):
            peak[0] = max(peak[0], tree_pss(child.pid))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = child.communicate(json.dumps(cfg))
    done.set()
    sampler.join()
    if child.returncode != 0:
        raise SystemExit(f"data_bench: run {cfg['name']} failed (exit {child.returncode})")
    r = json.loads(out.strip().splitlines()[-1])
    waits = sorted(r["waits"])
    r.update(name=cfg["name"], kind=cfg["kind"], resident_before=resident, peak_pss=peak[0],
             wait_mean_ms=1000 * sum(waits) / len(waits), wait_p95_ms=1000 * waits[int(0.95 * (len(waits) - 1))],
             first_ms=1000 * r["waits"][0], steady_ms=1000 * sum(r["waits"][10:]) / max(1, len(waits) - 10),
             step_total_ms=1000 * r["total_s"] / len(waits), cpu_ms=1000 * r["cpu_s"] / len(waits),
             mb_s=len(waits) * cfg["batch"] * args.file_kb * 1024 / r["total_s"] / 1e6)
    del r["waits"]
    return r


def show(r: dict) -> None:
    extra = ""
    if r["kind"] == "viper":
        extra = f"  readers {r['readers_end']:>2} buffer {r['buffer_end']:>4} read-ahead peak {r['peak_buffered_bytes'] / 1e6:5.1f} MB"
    print(f"{r['name']:<18} wait/step {r['wait_mean_ms']:6.2f} ms (p95 {r['wait_p95_ms']:6.1f}, first {r['first_ms']:6.1f}, "
          f"steady {r['steady_ms']:6.2f})  step {r['step_total_ms']:6.2f} ms  CPU {r['cpu_ms']:5.1f} ms  {r['mb_s']:4.0f} MB/s  "
          f"PSS {r['peak_pss'] / 1e6:4.0f} MB  cached {max(0, r['resident_before']) / 1e6:4.1f} MB{extra}", flush=True)


def median_of(runs: list) -> dict:
    """One row per configuration: the medians of its runs' figures (runs of all rounds)."""
    out = dict(runs[0])
    for key in ("wait_mean_ms", "wait_p95_ms", "first_ms", "steady_ms", "step_total_ms", "cpu_ms", "mb_s", "peak_pss"):
        vals = sorted(r[key] for r in runs)
        out[key] = vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2
    out["runs"] = len(runs)
    return out


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Details: the module docstring (head -40 bench/data_bench.py) and docs/BENCHMARKS.md.")
    ap.add_argument("--dir", default="/tmp/viper-data-bench", help="where the data set lives (made if missing)")
    ap.add_argument("--gb", type=float, default=2.0, help="data set size in GB")
    ap.add_argument("--file-kb", type=int, default=128, help="size of each sample file in KiB")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=300, help="training steps per run")
    ap.add_argument("--step-ms", type=float, default=10.0, help="the accelerator's share of a step (sleep)")
    ap.add_argument("--workers", default="0,1,2,4,8", help="torch DataLoader num_workers to sweep")
    ap.add_argument("--prefetch-factor", type=int, default=2)
    ap.add_argument("--readers", default="1,2,4,8,16,32", help="fixed viper reader counts to sweep")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of the viper runs (fixed sweep and auto interleaved; medians are reported)")
    ap.add_argument("--torch-rounds", type=int, default=1, help="rounds of the torch sweep")
    ap.add_argument("--autos", type=int, default=2, choices=[1, 2], help="auto-tuned runs per round [%(default)s]")
    ap.add_argument("--evict", choices=["fadvise", "drop", "none"], default="fadvise")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="", help="write every figure here")
    ap.add_argument("--run-one", default="", help=argparse.SUPPRESS)
    return ap.parse_args()


def sweep(configs: list, rounds: int, args, paths: list) -> list:
    """Every config once per round, in an order rotated each round (drift of the machine's load
    spreads over the configs); returns the median row of each config."""
    runs = {c["name"]: [] for c in configs}
    for k in range(rounds):
        order = configs[k % len(configs):] + configs[:k % len(configs)]
        for cfg in order:
            r = measure(cfg, args, paths)
            r.update({key: cfg[key] for key in ("inflight_bytes",) if key in cfg})
            show(r)
            if r.get("tuner") is not None and r["name"].startswith("viper auto"):
                print(f"  tuner (s, readers, buffer): {r['tuner'][:10]}{' ...' if len(r['tuner']) > 10 else ''}")
            runs[cfg["name"]].append(r)
    return [median_of(runs[c["name"]]) for c in configs]


def main() -> None:
    args = parse_args()
    if args.run_one:
        print(json.dumps(run_one(json.loads(sys.stdin.read()))))
        return

    paths = dataset_files(args.dir, args.gb, args.file_kb)
    n = args.steps * args.batch
    if n > len(paths):
        raise SystemExit(f"data_bench: {args.steps} steps of {args.batch} need {n} samples, the data set has {len(paths)}")
    ids = random.Random(args.seed).sample(range(len(paths)), n)
    run_paths = [paths[i] for i in ids]
    batch_bytes = args.batch * args.file_kb * 1024
    print(f"data set {len(paths)} files x {args.file_kb} KiB = {len(paths) * args.file_kb * 1024 / 1e9:.2f} GB in "
          f"{args.dir}; each run: {args.steps} steps x {args.batch} samples ({n * args.file_kb * 1024 / 1e9:.2f} GB), "
          f"step = one pass over x + {args.step_ms} ms sleep; eviction: {args.evict}", flush=True)
    evict(paths, args.evict)
    disk = disk_baseline(run_paths)
    print(f"physical baseline: the same samples read cold by 16 plain threads: {disk:.0f} MB/s", flush=True)

    base = dict(paths=paths, ids=ids, batch=args.batch, steps=args.steps, step_ms=args.step_ms, seed=args.seed,
                dir=args.dir)
    torch_cfgs = [dict(base, kind="torch", name=f"torch workers={w}", workers=w, prefetch_factor=args.prefetch_factor,
                       inflight_bytes=batch_bytes * (w * args.prefetch_factor if w > 0 else 1))
                  for w in [int(v) for v in args.workers.split(",") if v != ""]]
    torch_rows = sweep(torch_cfgs, args.torch_rounds, args, paths)
    best_torch = min(torch_rows, key=lambda r: r["wait_mean_ms"])
    cap = best_torch["inflight_bytes"]
    print(f"best torch setting: {best_torch['name']}; viper runs get its in-flight memory: "
          f"max_buffer_bytes = {cap / 1e6:.1f} MB", flush=True)
    buffer = max(1, cap // (args.file_kb * 1024))  # all the memory the torch setting has
    fixed_cfgs = [dict(base, kind="viper", name=f"viper readers={r}", readers=r, buffer_samples=buffer, autotune=False,
                       cap_bytes=cap) for r in [int(v) for v in args.readers.split(",") if v != ""]]
    auto_cfgs = [dict(base, kind="viper", name=f"viper auto{i}", readers=2, buffer_samples=16, autotune=True,
                      cap_bytes=cap) for i in ("", "'")[:args.autos]]
    # Two auto configs, placed apart in the order: each round runs auto twice among the fixed ones.
    half = len(fixed_cfgs) // 2
    viper_rows = sweep(fixed_cfgs[:half] + auto_cfgs[:1] + fixed_cfgs[half:] + auto_cfgs[1:], args.rounds, args, paths)
    fixed = [r for r in viper_rows if not r["name"].startswith("viper auto")]
    autos = [r for r in viper_rows if r["name"].startswith("viper auto")]
    best_fixed = min(fixed, key=lambda r: r["step_total_ms"])
    auto_wait = sum(r["wait_mean_ms"] for r in autos) / len(autos)
    auto_step = sum(r["step_total_ms"] for r in autos) / len(autos)
    print(f"\nmedians over {args.rounds} round(s) (torch: {args.torch_rounds}):")
    for r in torch_rows + viper_rows:
        show(r)
    print(f"\nwait/step: best torch ({best_torch['name']}) {best_torch['wait_mean_ms']:.2f} ms, viper auto "
          f"{auto_wait:.2f} ms: {best_torch['wait_mean_ms'] / max(auto_wait, 1e-6):.2f}x lower (target >= 2)")
    print(f"time/step: viper auto {auto_step:.2f} ms vs best fixed ({best_fixed['name']}) "
          f"{best_fixed['step_total_ms']:.2f} ms: {auto_step / best_fixed['step_total_ms']:.3f}x (target <= 1.10); "
          f"wait/step {auto_wait:.2f} vs {best_fixed['wait_mean_ms']:.2f} ms")
    print(f"throughput: viper auto {sum(r['mb_s'] for r in autos) / len(autos):.0f} MB/s, best torch "
          f"{best_torch['mb_s']:.0f} MB/s, physical baseline {disk:.0f} MB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "disk_mb_s": disk, "cap_bytes": cap, "rows": torch_rows + viper_rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
