#!/usr/bin/python3
"""The collaborative sample cache's benchmark (docs/BENCHMARKS.md "Collaborative sample cache"):
data-parallel ranks on network-namespace hosts reading one data set from a shared, shaped source,
with viper.data's collaborative cache and, in the same run, the per-rank baselines.

    scripts/hosts.sh needs root and iproute2:
    /usr/bin/python3 bench/data_cache_bench.py --ranks 2,4 --json /tmp/cache.json

Hosts (scripts/hosts.sh): h1 is the source, a stand-in for a parallel file system: an HTTP/1.1
file server (keep-alive, threads) over a directory of --samples files of --sample-kb KiB, its link
shaped to --rate (1gbit) with tc tbf on its eth0, so that every rank's reads share that bandwidth.
h2.. are the ranks' nodes, one rank per host; the links between them are not shaped (a compute
fabric). Every rank reads a sample with an HTTP GET of its file (a connection per reader thread).

Modes, each for --epochs epochs with the same seed, the ranks in step per epoch (a barrier the
orchestrator holds while it reads the source's byte counter: the all-reduce of real training):
  cache    viper.data.DataLoader(rank, world_size, seed, cache_nodes=[every rank's node]): the
           collaborative cache (each sample kept at one owner node after its first read);
  viper    viper.data.DataLoader(rank, world_size, seed) without a cache: today's per-rank loader;
  torch    torch.utils.data.DataLoader(dataset, sampler=DistributedSampler, num_workers=--workers).
The step: --step-ms of sleep per batch of --batch samples (the accelerator's share).

Figures per mode and rank count: source bytes per epoch (the source host's transmitted bytes,
from its veth counter, so every byte that crossed the shaped link counts, headers included) as a
fraction of the data set, epoch time (slowest rank) for the first epoch and the mean of the later
ones, wait per step (mean over the ranks' steps of the later epochs), memory per node (the rank's
peak RSS, which includes the cache's shared memory: the rank's own node maps and fills it; the
cache's share is shown apart as node MB). Ratios: cache epoch time / viper and
torch epoch time after the first (target: >= 2x faster), cache source bytes per later epoch /
data set (target <= 5%).
"""
from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

PY = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ---------------------------------------------------------------- the source (h1)

class _Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per reader thread

    def log_message(self, *args) -> None:
        pass


def serve(directory: str, port: int) -> int:
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), lambda *a: _Handler(*a, directory=directory))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print("ready", flush=True)
    server.serve_forever()
    return 0


class HttpReader:
    """GET /<relative path>: one keep-alive connection per calling thread."""

    def __init__(self, host: str, port: int, paths: list):
        self.host, self.port, self.paths = host, port, paths
        self.local = threading.local()

    def __call__(self, i: int) -> bytes:
        for attempt in range(3):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                conn.request("GET", "/" + self.paths[i])
                r = conn.getresponse()
                body = r.read()
                if r.status != 200:
                    raise OSError(f"GET {self.paths[i]}: HTTP {r.status}")
                return body
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


# ---------------------------------------------------------------- one rank (h2..)

def rank_main(a) -> int:
    import resource

    import numpy as np
    manifest = json.load(open(os.path.join(a.data, "MANIFEST.json")))
    paths, size = manifest["paths"], manifest["sample_bytes"]
    host, port = a.source.rsplit(":", 1)
    read = HttpReader(host, int(port), paths)
    world, rank = a.world, a.rank
    nodes = a.nodes.split(",") if a.nodes else []

    def barrier(name):
        open(os.path.join(a.sync, f"{name}.{rank}"), "w").close()
        go = os.path.join(a.sync, f"go.{name}")
        while not os.path.exists(go):
            time.sleep(0.002)

    out = {"rank": rank, "mode": a.mode, "epoch_s": [], "wait_s": [], "steps": []}
    step_s = a.step_ms / 1000.0
    if a.mode == "torch":
        import torch
        import torch.utils.data as td
        torch.set_num_threads(1)

        class Files(td.Dataset):
            def __len__(self):
                return len(paths)

            def __getitem__(self, i):
                return torch.from_numpy(np.frombuffer(read(i), dtype=np.uint8).copy())

        sampler = td.distributed.DistributedSampler(Files(), num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
        loader = td.DataLoader(Files(), batch_size=a.batch, sampler=sampler, num_workers=a.workers,
                               prefetch_factor=2 if a.workers else None, persistent_workers=a.workers > 0)
    else:
        import viper.data as vd
        src = vd.callable_source(read, [size] * len(paths), name="http source")
        # epochs: the readers stop after the last one (no read-ahead into an epoch never run).
        kw = dict(batch_size=a.batch, rank=rank, world_size=world, seed=a.seed, max_buffer_bytes=64 << 20,
                  epochs=a.epochs)
        if a.mode == "cache":
            kw.update(cache_nodes=nodes, cache_token=os.environ["VIPER_TOKEN"], cache_options={"name": "bench"})
        loader = vd.DataLoader(src, **kw)
    barrier("up")
    for epoch in range(a.epochs):
        if a.mode == "torch":
            sampler.set_epoch(epoch)
        wait = 0.0
        steps = 0
        t0 = time.perf_counter()
        it = iter(loader)
        while True:
            t = time.perf_counter()
            batch = next(it, None)
            wait += time.perf_counter() - t
            if batch is None:
                break
            steps += 1
            if step_s:
                time.sleep(step_s)
        out["epoch_s"].append(time.perf_counter() - t0)
        out["wait_s"].append(wait)
        out["steps"].append(steps)
        barrier(f"e{epoch}")
    out["rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if a.mode == "torch" and a.workers:
        out["rss_bytes"] += resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 * a.workers
    if a.mode != "torch":
        st = loader.stats()
        out["source_bytes"] = st["source_bytes"]
        out["epoch_samples"] = st["epoch_samples"]
        if "cache" in st:
            out["cache"] = st["cache"]
            out["node_bytes"] = st["cache"]["node_bytes"]
    print(json.dumps(out), flush=True)
    barrier("done")
    if a.mode != "torch":
        loader.close()
    return 0


# ---------------------------------------------------------------- orchestration (root namespace)

def make_dataset(root: str, samples: int, sample_kb: int) -> None:
    size = sample_kb * 1024
    manifest = os.path.join(root, "MANIFEST.json")
    if os.path.exists(manifest):
        m = json.load(open(manifest))
        if len(m["paths"]) == samples and m["sample_bytes"] == size:
            return
    import numpy as np
    rng = np.random.default_rng(0)
    paths = []
    for i in range(samples):
        rel = f"c{i % 10}/{i:06d}.bin"
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        rng.integers(0, 256, size, dtype=np.uint8).tofile(os.path.join(root, rel))
        paths.append(rel)
    with open(manifest, "w") as f:
        json.dump({"paths": paths, "sample_bytes": size}, f)


def tx_bytes(prefix: str, host: int) -> int:
    out = subprocess.run(["ip", "-n", f"{prefix}-h{host}", "-s", "-j", "link", "show", "eth0"], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)[0]["stats64"]["tx"]["bytes"]


def addr(host: int) -> str:
    return f"10.77.0.{host}"


class Run:
    def __init__(self, a, prefix: str):
        self.a, self.prefix = a, prefix

    def one(self, mode: str, world: int) -> dict:
        a = self.a
        sync = tempfile.mkdtemp(prefix=f"sync.{mode}{world}.", dir=a.workdir)
        nodes = ",".join(f"{addr(h)}:7611" for h in range(2, world + 2))
        procs = []
        for r in range(world):
            argv = ["ip", "netns", "exec", f"{self.prefix}-h{r + 2}", PY, os.path.abspath(__file__), "--rank-proc",
                    "--mode", mode, "--rank", str(r), "--world", str(world), "--nodes", nodes,
                    "--source", f"{addr(1)}:7610", "--data", a.data, "--sync", sync, "--epochs", str(a.epochs),
                    "--batch", str(a.batch), "--step-ms", str(a.step_ms), "--workers", str(a.workers), "--seed",
                    str(a.seed)]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        names = ["up"] + [f"e{e}" for e in range(a.epochs)] + ["done"]
        source = []
        deadline = time.time() + a.timeout
        last = tx_bytes(self.prefix, 1)
        for name in names:
            while sum(os.path.exists(os.path.join(sync, f"{name}.{r}")) for r in range(world)) < world:
                if time.time() > deadline or any(p.poll() not in (None, 0) for p in procs):
                    for p in procs:
                        p.kill()
                    errs = "\n".join(p.communicate()[1][-2000:] for p in procs)
                    raise RuntimeError(f"{mode} x{world}: stuck or failed at {name}:\n{errs}")
                time.sleep(0.005)
            now = tx_bytes(self.prefix, 1)
            if name.startswith("e"):
                source.append(now - last)
            last = now
            open(os.path.join(sync, f"go.{name}"), "w").close()
        ranks = []
        exit_failures = 0
        for p in procs:
            out, err = p.communicate(timeout=60)
            lines = out.strip().splitlines()
            if p.returncode != 0 and not (lines and lines[-1].startswith("{")):
                raise RuntimeError(f"{mode} x{world}: a rank failed:\n{err[-3000:]}")
            if p.returncode != 0:  # its figures are in, but closing failed: reported, not hidden
                exit_failures += 1
                print(f"data_cache_bench: {mode} x{world}: a rank exited with {p.returncode} after its last epoch:\n"
                      f"{err[-1500:]}", file=sys.stderr)
            ranks.append(json.loads(lines[-1]))
        shutil.rmtree(sync, ignore_errors=True)
        row = summarise(mode, world, ranks, source, self.dataset_bytes)
        row["exit_failures"] = exit_failures
        return row

    def run(self) -> dict:
        a = self.a
        self.dataset_bytes = a.samples * a.sample_kb * 1024
        server = subprocess.Popen(["ip", "netns", "exec", f"{self.prefix}-h1", PY, os.path.abspath(__file__),
                                   "--serve", a.data], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "ready"
            subprocess.run(["ip", "netns", "exec", f"{self.prefix}-h1", "tc", "qdisc", "replace", "dev", "eth0", "root",
                            "tbf", "rate", a.rate, "burst", "1mb", "latency", "200ms"], check=True)
            rows = []
            for world in [int(w) for w in a.ranks.split(",")]:
                for mode in a.modes.split(","):
                    row = self.one(mode, world)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            return {"samples": a.samples, "sample_bytes": a.sample_kb * 1024, "dataset_bytes": self.dataset_bytes,
                    "rate": a.rate, "epochs": a.epochs, "batch": a.batch, "step_ms": a.step_ms,
                    "workers": a.workers, "rows": rows}
        finally:
            server.terminate()
            server.wait(timeout=20)


def summarise(mode: str, world: int, ranks: list, source: list, dataset_bytes: int) -> dict:
    epochs = len(source)
    epoch_s = [max(r["epoch_s"][e] for r in ranks) for e in range(epochs)]
    later = range(1, epochs)
    steps = sum(r["steps"][e] for r in ranks for e in later)
    wait = sum(r["wait_s"][e] for r in ranks for e in later)
    mem = [r["rss_bytes"] for r in ranks]  # the cache's shared memory included: the rank maps and fills it
    row = {"mode": mode, "ranks": world, "epoch_s": [round(s, 3) for s in epoch_s],
           "first_epoch_s": round(epoch_s[0], 3),
           "later_epoch_s": round(sum(epoch_s[1:]) / max(1, epochs - 1), 3),
           "source_fraction": [round(b / dataset_bytes, 4) for b in source],
           "later_source_fraction": round(sum(source[1:]) / max(1, epochs - 1) / dataset_bytes, 4),
           "wait_per_step_ms": round(1000 * wait / max(1, steps), 3),
           "memory_per_node_mb": round(max(mem) / 2**20, 1),
           "steps_per_epoch": [sum(r["steps"][e] for r in ranks) for e in range(epochs)]}
    if mode != "torch":
        row["epoch_samples"] = [sum(r["epoch_samples"][e] for r in ranks) for e in range(epochs)]
    if mode == "cache":
        row["node_mb"] = round(max(r["node_bytes"] for r in ranks) / 2**20, 1)
        row["remote_hits"] = sum(r["cache"]["remote_hits"] for r in ranks)
        row["local_hits"] = sum(r["cache"]["local_hits"] for r in ranks)
    return row


def print_summary(res: dict) -> None:
    print(f"\n{res['samples']} samples x {res['sample_bytes'] // 1024} KiB = {res['dataset_bytes'] / 1e6:.0f} MB, "
          f"source shaped to {res['rate']}, {res['epochs']} epochs, batch {res['batch']}, step {res['step_ms']} ms")
    print(f"{'mode':6} {'ranks':>5} {'epoch 1 s':>9} {'later s':>8} {'src/epoch':>9} {'wait ms':>8} {'mem MB':>7}")
    by = {}
    for r in res["rows"]:
        by[(r["mode"], r["ranks"])] = r
        print(f"{r['mode']:6} {r['ranks']:5d} {r['first_epoch_s']:9.2f} {r['later_epoch_s']:8.2f} "
              f"{100 * r['later_source_fraction']:8.1f}% {r['wait_per_step_ms']:8.2f} {r['memory_per_node_mb']:7.0f}")
    for (mode, world), r in sorted(by.items()):
        if mode != "cache":
            continue
        for base in ("viper", "torch"):
            b = by.get((base, world))
            if b:
                print(f"{world} ranks: {base} later epoch / cache later epoch = "
                      f"{b['later_epoch_s'] / max(r['later_epoch_s'], 1e-9):.1f}x (target >= 2)")
        print(f"{world} ranks: cache source bytes per later epoch = {100 * r['later_source_fraction']:.2f}% of the "
              "data set (target <= 5%)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4", help="rank counts [%(default)s]")
    ap.add_argument("--modes", default="cache,viper,torch", help="[%(default)s]")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--sample-kb", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--workers", type=int, default=4, help="torch DataLoader workers per rank [%(default)s]")
    ap.add_argument("--rate", default="1gbit", help="the source link's rate (tc tbf) [%(default)s]")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--workdir", default=None, help="data set and scratch (default: a temporary directory)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mode and rank count")
    ap.add_argument("--json", default=None)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank-proc", action="store_true", help=argparse.SUPPRESS)
    for name in ("--mode", "--nodes", "--source", "--data", "--sync"):
        ap.add_argument(name, default="", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        return serve(a.serve, 7610)
    if a.rank_proc:
        return rank_main(a)
    if not a.inner:
        if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
            print("data_cache_bench: needs root, iproute2 and tc (network-namespace hosts)", file=sys.stderr)
            return 2
        hosts = max(int(w) for w in a.ranks.split(",")) + 1
        env = dict(os.environ, UCX_TLS="tcp", VIPER_HOSTS_QUIET="1", VIPER_TOKEN=secrets.token_hex(16))
        return subprocess.call([os.path.join(ROOT, "scripts", "hosts.sh"), "run", str(hosts), "--", PY,
                                os.path.abspath(__file__), "--inner", *sys.argv[1:]], env=env)
    own = a.workdir is None
    a.workdir = a.workdir or tempfile.mkdtemp(prefix="cachebench.")
    os.makedirs(a.workdir, exist_ok=True)
    os.chmod(a.workdir, 0o755)
    a.data = os.path.join(a.workdir, "data")
    try:
        make_dataset(a.data, a.samples, a.sample_kb)
        res = Run(a, os.environ["VIPER_HOST_PREFIX"]).run()
        print_summary(res)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0
    finally:
        if own:
            shutil.rmtree(a.workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
