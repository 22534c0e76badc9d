#!/usr/bin/env python3
"""The GPU baseline without Viper: torch.save + polling + torch.load(map_location="cuda").

A producer process holds a bf16 state_dict of 32 tensors on the GPU and, per update, writes it
with torch.save to a temporary name and renames it into the watched directory (atomic, no fsync:
kinder to the baseline than a durable write); a consumer process polls the directory every
--poll-interval seconds and loads each new file with torch.load(map_location="cuda"), then
synchronizes. Latency = producer's start of save -> consumer's tensors on the GPU (CLOCK_MONOTONIC
is shared by both processes). Also: save alone, load alone and one device-to-device copy of the
same bytes (torch, timed with CUDA events), the floor `viper bench --gpu` compares against.

  python3 bench/gpu_torch_baseline.py --sizes 1.7G,8G --reps 2 --json out.json
Needs only torch with a CUDA device; prints "UNAVAILABLE: ..." and exits 3 without one.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def parse_size(text):
    units = {"K": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            value = int(float(text[: -len(suffix)]) * units[suffix])
            break
    else:
        value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size '{text}' must be more than 0 bytes")
    return value


def state_dict(torch, nbytes):
    per = (nbytes // 32) // 2  # bf16 elements per tensor
    g = torch.Generator(device="cuda").manual_seed(1)
    return {f"layer{i}": torch.randn(per, device="cuda", dtype=torch.bfloat16, generator=g) for i in range(32)}


def consumer(directory, interval, count):
    import torch

    torch.zeros(1, device="cuda")  # CUDA context made before the first update
    print("READY", flush=True)
    seen = set()
    while len(seen) < count:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".pt") and n not in seen)
        if not names:
            time.sleep(interval)
            continue
        for name in names:
            t = time.monotonic()
            sd = torch.load(os.path.join(directory, name), map_location="cuda")
            torch.cuda.synchronize()
            done = time.monotonic()
            print(f"LOADED {name} {done:.6f} {done - t:.6f} {sum(v.numel() * v.element_size() for v in sd.values())}", flush=True)
            del sd
            seen.add(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1.7G,8G")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--poll-interval", type=float, default=1.0, help="consumer's polling interval, s (TF Serving default 1)")
    ap.add_argument("--dir", default=None, help="where the files go (default: a new directory under /var/tmp)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--consumer", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.consumer:
        consumer(a.consumer[0], float(a.consumer[1]), int(a.consumer[2]))
        return 0
    try:
        import torch
    except ImportError as e:
        print(f"UNAVAILABLE: torch not importable: {e}")
        return 3
    if not torch.cuda.is_available():
        print("UNAVAILABLE: torch sees no CUDA device")
        return 3
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "poll_interval_s": a.poll_interval, "sizes": []}
    print(f"torch {torch.__version__} on {results['device']}; poll interval {a.poll_interval} s; {a.reps} reps (medians)")
    for nbytes in sizes:
        directory = tempfile.mkdtemp(prefix="viper-torch-", dir=a.dir or "/var/tmp")
        sd = state_dict(torch, nbytes)
        total = sum(v.numel() * v.element_size() for v in sd.values())
        # One device-to-device copy of the same bytes (the floor).
        flat = torch.empty(total, dtype=torch.uint8, device="cuda")
        src = torch.empty(total, dtype=torch.uint8, device="cuda").random_(0, 255)
        copies = []
        for _ in range(4):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            flat.copy_(src)
            e1.record()
            e1.synchronize()
            copies.append(e0.elapsed_time(e1))
        del flat, src
        copy_ms = sorted(copies[1:])[len(copies[1:]) // 2]
        proc = subprocess.Popen([sys.executable, __file__, "--consumer", directory, str(a.poll_interval), str(a.reps)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "READY"
        lat, save, load = [], [], []
        for r in range(a.reps):
            torch.cuda.synchronize()
            t0 = time.monotonic()
            tmp = os.path.join(directory, f".v{r}.tmp")
            torch.save(sd, tmp)
            os.rename(tmp, os.path.join(directory, f"v{r:04d}.pt"))
            save.append(time.monotonic() - t0)
            line = proc.stdout.readline().split()
            assert line and line[0] == "LOADED" and int(line[4]) == total, line
            lat.append(float(line[2]) - t0)
            load.append(float(line[3]))
            os.unlink(os.path.join(directory, f"v{r:04d}.pt"))
        proc.wait(timeout=60)
        med = lambda v: sorted(v)[len(v) // 2]
        row = {"bytes": total, "device_copy_ms": copy_ms, "latency_s": med(lat), "save_s": med(save), "load_s": med(load),
               "latencies_s": lat}
        results["sizes"].append(row)
        print(f"{total / 1e9:.2f} GB: save -> poll -> load to cuda {row['latency_s']:.2f} s (save {row['save_s']:.2f} s, "
              f"load {row['load_s']:.2f} s); one device copy {copy_ms:.2f} ms; ratio {row['latency_s'] * 1e3 / copy_ms:.0f}x",
              flush=True)
        del sd
        torch.cuda.empty_cache()
        os.rmdir(directory)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
