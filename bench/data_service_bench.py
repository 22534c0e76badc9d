#!/usr/bin/python3
"""The data service's benchmark (docs/BENCHMARKS.md "Data service"): --jobs training processes on
one host reading one data set for --epochs epochs (jobs of a hyper-parameter search: each its own
seed, each the whole data set per epoch), in three modes in the same run:

  service      one data service (python3 -m viper.data_service serve) and every process a
               viper.data.DataLoader(service=...): one cache in shared memory, the service's readers;
  independent  every process its own viper.data.DataLoader(path): no cache, each reads the source
               every epoch (today's loader);
  cached       every process its own DataLoader(path, cache_nodes=[its own node]): each keeps its
               own copy of the data set in its own node's shared memory.

Figures per mode: source bytes (all processes together; the service's per-job counters, or each
loader's stats()["source_bytes"]) as a multiple of the data set; shared memory held by the caches
(the segments in /dev/shm); the bytes read ahead (peak, all readers together); anonymous memory
(RssAnon) of the service (service mode) and of the training processes, measured while every
process is still attached after its last epoch; wall time until every process finished. Ratios:
independent / service source bytes, cached / service shared memory.

    PYTHONPATH=build/python /usr/bin/python3 bench/data_service_bench.py --jobs 4 --json /tmp/svc.json
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

from loopback_ports import free_port

JOB = textwrap.dedent(r"""
    import json, os, sys, time
    import numpy as np
    import viper.data as vd
    mode, tree, job, seed, epochs, workdir, arg = sys.argv[1:8]
    seed, epochs = int(seed), int(epochs)
    if mode == "service":
        loader = vd.DataLoader(None, batch_size=32, seed=seed, service=arg, service_job=job)
    elif mode == "cached":
        loader = vd.DataLoader(tree, batch_size=32, seed=seed, cache_nodes=[arg], cache_options={"name": "bench"})
    else:
        loader = vd.DataLoader(tree, batch_size=32, seed=seed)
    n = 0
    for epoch in range(epochs):
        for x, y in loader:
            n += len(x)
    st = loader.stats()
    out = {"samples": n, "source_bytes": st["source_bytes"], "peak_buffered_bytes": st.get("peak_buffered_bytes", 0)}
    if mode == "service":
        out["peak_buffered_bytes"] = st["service"]["peak_buffered_bytes"]
        out["mapped_samples"], out["inline_samples"] = st["mapped_samples"], st["inline_samples"]
    if mode == "cached":
        out["shm_bytes"] = st["cache"]["node_bytes"]
    open(os.path.join(workdir, f"done.{job}"), "w").write(json.dumps(out))
    while not os.path.exists(os.path.join(workdir, "release")):
        time.sleep(0.01)
    loader.close()
""")


def anon_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def run_mode(mode: str, tree: str, jobs: int, epochs: int, workdir: str, env: dict) -> dict:
    os.makedirs(workdir)
    service = None
    address = ""
    if mode == "service":
        address = f"127.0.0.1:{free_port()}"
        service = subprocess.Popen([sys.executable, "-m", "viper.data_service", "serve", tree, "--listen", address],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = service.stdout.readline()
        if not line.startswith("listening on"):
            raise SystemExit(f"the service did not start: {line}{service.stderr.read()}")
    t0 = time.perf_counter()
    procs = []
    for j in range(jobs):
        arg = address if mode == "service" else f"127.0.0.1:{free_port()}"
        procs.append(subprocess.Popen([sys.executable, "-c", JOB, mode, tree, f"job{j}", str(10 + j), str(epochs),
                                       workdir, arg], stderr=subprocess.PIPE, text=True, env=env))
    while len(glob.glob(os.path.join(workdir, "done.*"))) < jobs:
        for p in procs:
            if p.poll() is not None and p.returncode != 0:
                raise SystemExit(f"{mode}: a job failed: {p.stderr.read()}")
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    outs = [json.load(open(os.path.join(workdir, f"done.job{j}"))) for j in range(jobs)]
    anon_jobs = sum(anon_bytes(p.pid) for p in procs)
    row = {"mode": mode, "jobs": jobs, "epochs": epochs, "wall_seconds": round(wall, 3), "anon_jobs_bytes": anon_jobs,
           "peak_read_ahead_bytes": sum(o["peak_buffered_bytes"] for o in outs),
           "samples": sum(o["samples"] for o in outs)}
    if mode == "service":
        sys.path.insert(0, env["PYTHONPATH"])
        import viper.data as vd
        with vd.ServiceControl(address) as ctl:
            st = ctl.stats()
        row["source_bytes"] = st["total"]["source_bytes"]
        row["shm_bytes"] = st["cache"]["node_bytes"]
        row["anon_service_bytes"] = st["rss_anon_bytes"]
        row["peak_read_ahead_bytes"] = sum(j["peak_buffered_bytes"] for j in st["jobs"].values())
        row["mapped_samples"] = sum(o["mapped_samples"] for o in outs)
        row["inline_samples"] = sum(o["inline_samples"] for o in outs)
    else:
        row["source_bytes"] = sum(o["source_bytes"] for o in outs)
        row["shm_bytes"] = sum(o.get("shm_bytes", 0) for o in outs)
        row["anon_service_bytes"] = 0
    open(os.path.join(workdir, "release"), "w").close()
    for p in procs:
        p.wait(timeout=120)
        if p.returncode != 0:
            raise SystemExit(f"{mode}: a job failed: {p.stderr.read()}")
    if service is not None:
        service.send_signal(signal.SIGTERM)
        service.communicate(timeout=60)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--sample-kb", type=int, default=64)
    ap.add_argument("--modes", default="service,independent,cached")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    for name in ("jobs", "epochs", "samples", "sample_kb"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
    work = tempfile.mkdtemp(prefix="viper-svc-bench.")
    try:
        tree = os.path.join(work, "tree")
        width = args.sample_kb * 1024
        for c in range(4):
            os.makedirs(os.path.join(tree, f"class{c}"))
        rng = np.random.default_rng(0)
        for i in range(args.samples):
            rng.integers(0, 256, width, dtype=np.uint8).tofile(os.path.join(tree, f"class{i % 4}", f"{i:06d}.bin"))
        data = args.samples * width
        rows = [run_mode(m, tree, args.jobs, args.epochs, os.path.join(work, m), env) for m in args.modes.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by = {r["mode"]: r for r in rows}
    print(f"{args.jobs} processes x {args.epochs} epochs of {args.samples} samples x {args.sample_kb} KiB "
          f"({data / 2**20:.1f} MiB)")
    print(f"{'mode':12} {'source':>10} {'x data':>7} {'shm MiB':>8} {'read-ahead MiB':>15} {'anon MiB':>9} "
          f"{'wall s':>7}")
    for r in rows:
        r["source_x_data"] = round(r["source_bytes"] / data, 3)
        anon = r["anon_jobs_bytes"] + r["anon_service_bytes"]
        print(f"{r['mode']:12} {r['source_bytes'] / 2**20:9.1f}M {r['source_x_data']:7.3f} "
              f"{r['shm_bytes'] / 2**20:8.1f} {r['peak_read_ahead_bytes'] / 2**20:15.1f} {anon / 2**20:9.1f} "
              f"{r['wall_seconds']:7.2f}")
    ratios = {}
    if "service" in by and "independent" in by:
        ratios["source_bytes_independent_over_service"] = round(by["independent"]["source_bytes"] /
                                                                by["service"]["source_bytes"], 2)
    if "service" in by and "cached" in by:
        ratios["shm_cached_over_service"] = round(by["cached"]["shm_bytes"] / by["service"]["shm_bytes"], 2)
        ratios["source_bytes_cached_over_service"] = round(by["cached"]["source_bytes"] / by["service"]["source_bytes"], 2)
    print("ratios:", json.dumps(ratios))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"data_bytes": data, "rows": rows, "ratios": ratios}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
