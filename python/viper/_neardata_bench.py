"""python3 -m viper.neardata bench: near-data processing against the disaggregated baseline, in
the same run, on network-namespace hosts (scripts/hosts.sh; root).

Host h1 is the compute node (the Tuner and its Publisher; the baseline's inference and training),
h2.. are storage hosts, each holding one shard of the same synthetic data set (viper._ndsynth).
With two or more CPUs the compute host runs on the first and the storage hosts on the others
(taskset), so that, as on separate machines, neither side's work slows the other's.
For each store count n: n PipeStores (`serve` processes) and n HTTP file servers (the baseline's
storage side). Network bytes are every byte the hosts sent, read from the hub's bridge ports.
  relabel  near-data: a new version is published, every store relabels its shard; bytes and
           the time from publish to the last store's last label. Baseline: the compute node
           downloads every shard over HTTP and relabels it itself.
  finetune (n = the largest count) FT-DMP non-pipelined and pipelined against the baseline, which
           reads every raw sample once per epoch; same data, order, seeds and hyperparameters;
           accuracy on a held-out set, bytes per epoch, the Tuner's busy fraction.
"""
from __future__ import annotations

import json
import os
import platform
import queue
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

PY = "/usr/bin/python3"
# The fine-tuning step size is this over --local-epochs: the head moves about as far in a round
# whatever the number of passes (accuracy 93.9-94.1% at 10, 20, 40 and 60 passes on the bench's data).
LR_TIMES_LOCAL_EPOCHS = 2.0


def _hosts_script() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("VIPER_HOSTS_SCRIPT", "")]
    candidates += [os.path.join(here, *([".."] * up), "scripts", "hosts.sh") for up in (2, 3)]
    for c in candidates:
        if c and os.path.isfile(c):
            return os.path.abspath(c)
    raise SystemExit("viper.neardata bench: scripts/hosts.sh not found (set VIPER_HOSTS_SCRIPT)")


def run(args) -> int:
    for name in ("samples", "epochs", "chunks", "local_epochs"):
        if getattr(args, name) < 1:
            print(f"viper.neardata bench: --{name.replace('_', '-')} {getattr(args, name)}: must be >= 1", file=sys.stderr)
            return 2
    if not args.inner:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            print("viper.neardata bench: needs root and iproute2 (network-namespace hosts)", file=sys.stderr)
            return 2
        counts = [int(c) for c in args.stores.split(",")]
        argv = ["--stores", args.stores, "--samples", str(args.samples), "--epochs", str(args.epochs), "--chunks",
                str(args.chunks), "--local-epochs", str(args.local_epochs), "--seed", str(args.seed), "--inner"]
        argv += ["--workdir", args.workdir] if args.workdir else []
        argv += ["--json", os.path.abspath(args.json)] if args.json else []
        argv += ["--quick"] if args.quick else []
        env = dict(os.environ, UCX_TLS="tcp", VIPER_HOSTS_QUIET="1", VIPER_TOKEN=secrets.token_hex(16))
        return subprocess.call([_hosts_script(), "run", str(max(counts) + 1), "--", "sh", "-c",
                                'exec ip netns exec "$VIPER_HOST_PREFIX-h1" "$@"', "sh", PY, "-m", "viper.neardata",
                                "bench", *argv], env=env)
    return _Bench(args).run()


class _Store:
    """One `serve` process on a storage host, its events read by a thread."""

    def __init__(self, prefix: str, host: int, name: str, argv: list, log, pin: list):
        self.name = name
        self.events: "queue.Queue[dict]" = queue.Queue()
        self.proc = subprocess.Popen(["ip", "netns", "exec", f"{prefix}-h{host}", *pin, PY, "-m", "viper.neardata",
                                      *argv], stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        self.refreshed = 0
        self.last_refresh = 0.0
        self.feature_rounds: list = []  # the `features` events (FT-DMP rounds), for the timeline
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "features":
                self.feature_rounds.append(event)
            self.events.put(event)
        self.events.put({"event": "exited"})

    def wait(self, what, deadline: float) -> dict:
        while True:
            try:
                e = self.events.get(timeout=max(deadline - time.time(), 0.01))
            except queue.Empty:
                raise TimeoutError(f"store {self.name}: timed out waiting") from None
            if e["event"] in ("exited", "failed"):
                raise RuntimeError(f"store {self.name}: {e}")
            if e["event"] == "refreshed":
                self.refreshed, self.last_refresh = e["version"], e["time"]
            if what(e):
                return e

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Bench:
    def __init__(self, args):
        self.args = args
        self.prefix = os.environ["VIPER_HOST_PREFIX"]
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.own_workdir = not args.workdir  # a temporary one is removed at the end
        self.workdir = args.workdir or tempfile.mkdtemp(prefix="ndbench.", dir=base)
        os.makedirs(self.workdir, exist_ok=True)
        self.log = open(os.path.join(self.workdir, "stores.log"), "a")
        self.counts = [int(c) for c in args.stores.split(",")]
        self.lr = LR_TIMES_LOCAL_EPOCHS / args.local_epochs
        # The hosts share this machine's cores: the compute host gets the first, the storage hosts
        # the others, as separate machines would not steal each other's CPU. Each storage host's
        # processes also run in a session of their own: with the kernel's autogroup scheduling a
        # session is one group whose weight is split among the CPUs it runs on, so stores in the
        # compute host's session took CPU weight from the Tuner whenever they ran.
        cpus = sorted(os.sched_getaffinity(0))
        self.pin = []
        self.cpus = {"compute": cpus, "storage": cpus}
        if len(cpus) >= 2 and shutil.which("taskset"):
            os.sched_setaffinity(0, cpus[:1])  # before any thread starts: they all inherit it
            self.pin = ["taskset", "-c", ",".join(str(c) for c in cpus[1:])]
            self.cpus = {"compute": cpus[:1], "storage": cpus[1:]}
        if args.quick:
            args.samples, args.epochs, args.chunks = min(args.samples, 1024), 1, 2

    def wire_bytes(self, by_host: bool = False):
        """Bytes every host sent so far: rx of the hub's bridge ports h1.. (one per host); with
        by_host, {port name: bytes}."""
        out = subprocess.run(["ip", "-n", f"{self.prefix}-br", "-s", "-j", "link", "show"], capture_output=True,
                             text=True, check=True).stdout
        ports = {link["ifname"]: link["stats64"]["rx"]["bytes"] for link in json.loads(out) if link["ifname"].startswith("h")}
        return ports if by_host else sum(ports.values())

    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.log.close()
            if self.own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _run(self) -> int:
        import numpy as np
        import torch
        from . import _ndsynth as synth
        torch.set_num_threads(1)
        a = self.args
        x, y = synth.samples(a.samples, a.seed)
        tx, ty = synth.samples(1000, a.seed + 1)
        self.test = (torch.from_numpy(tx.reshape(len(ty), -1)), torch.from_numpy(ty))
        results = {"machine": _machine(), "cpus": self.cpus, "samples": a.samples, "sample_bytes": int(x[0].nbytes), "relabel": []}
        for n in self.counts:
            shard_dir = os.path.join(self.workdir, f"n{n}")
            os.makedirs(shard_dir, exist_ok=True)
            for k, idx in enumerate(np.array_split(np.arange(a.samples), n)):
                from . import data as vd
                vd.write_records(os.path.join(shard_dir, f"s{k + 1}.rec"),
                                 ((x[i].reshape(-1).view(np.uint8), int(y[i])) for i in idx))
            row, ft = self.one_count(n, shard_dir, finetune=(n == max(self.counts)))
            results["relabel"].append(row)
            if ft is not None:
                results["finetune"] = ft
            print(json.dumps({"stores": n, **row}), flush=True)
        _print_summary(results)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
        return 0

    def one_count(self, n: int, shard_dir: str, finetune: bool):
        from . import _ndsynth as synth
        from ._tuner import Tuner
        a = self.args
        model = f"ndb{n}"
        names = [f"s{k}" for k in range(1, n + 1)]
        stores, servers = [], []
        tuner = Tuner(model, synth.build, {s: f"10.77.0.{k + 1}:{7800 + n}" for k, s in enumerate(names, 1)},
                      listen=f"10.77.0.1:{7700 + n}", seed=a.seed, lr=self.lr, local_epochs=a.local_epochs,
                      subscriber_options={"path": "remote"}, delta="always",
                      token=os.environ["VIPER_TOKEN"])
        try:
            for k, s in enumerate(names, 1):
                host = k + 1
                stores.append(_Store(self.prefix, host, s, [
                    "serve", "--model", model, "--factory", "viper._ndsynth:build", "--data",
                    os.path.join(shard_dir, f"{s}.rec"), "--labels", os.path.join(shard_dir, f"{s}.db"), "--connect",
                    tuner.address, "--name", s, "--features-listen", f"10.77.0.{host}:{7800 + n}", "--path", "remote",
                    "--json"], self.log, self.pin))
                servers.append(subprocess.Popen(["ip", "netns", "exec", f"{self.prefix}-h{host}", *self.pin, PY, "-m",
                                                 "viper.neardata", "fileserver", "--dir", shard_dir, "--insecure",
                                                 "--listen", f"10.77.0.{host}:{8000 + n}"], stdout=subprocess.DEVNULL,
                                                stderr=self.log, start_new_session=True))
            deadline = time.time() + 300
            for st in stores:
                st.wait(lambda e: e["event"] == "ready", deadline)
            first = tuner.publish().version
            self._all_refreshed(stores, first, deadline)
            # Near-data relabel of a new version.
            synth.perturb(tuner.module, seed=a.seed + n)
            b0 = self.wire_bytes()
            published = time.time()
            version = tuner.publish().version
            self._all_refreshed(stores, version, deadline)
            near = {"bytes": self.wire_bytes() - b0, "seconds": max(st.last_refresh for st in stores) - published}
            base = self._baseline_relabel(n, tuner.module)
            row = {"stores": n, "near_bytes": near["bytes"], "near_seconds": round(near["seconds"], 3),
                   "baseline_bytes": base["bytes"], "baseline_seconds": round(base["seconds"], 3),
                   "bytes_ratio": near["bytes"] / base["bytes"], "label_bytes_if_shipped": 20 * a.samples}
            ft = self._finetune(tuner, stores, n, deadline + 600) if finetune else None
            return row, ft
        finally:
            tuner.close()  # first: the stores' ends of its connections close quietly
            for st in stores:
                st.stop()
            for p in servers:
                p.terminate()
                p.wait()

    def _all_refreshed(self, stores, version: int, deadline: float) -> None:
        for st in stores:
            if st.refreshed < version:
                st.wait(lambda e: e["event"] == "refreshed" and e["version"] >= version, deadline)

    def _fetch_shards(self, n: int):
        """Every shard over HTTP from its storage host, side by side; returns local copies' paths."""
        out = [None] * n

        def get(k):
            url = f"http://10.77.0.{k + 2}:{8000 + n}/s{k + 1}.rec"
            local = os.path.join(self.workdir, f"fetched.{n}.{k}.rec")
            with urllib.request.urlopen(url, timeout=60) as r, open(local, "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
            out[k] = local
        threads = [threading.Thread(target=get, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if None in out:
            raise RuntimeError("baseline: a shard download failed")
        return out

    def _baseline_relabel(self, n: int, module) -> dict:
        import numpy as np
        import torch
        from . import data as vd
        from ._labeldb import LabelDB
        from .neardata import default_transform, softmax_postprocess
        b0 = self.wire_bytes()
        t0 = time.time()
        db = LabelDB(os.path.join(self.workdir, f"baseline.{n}.{time.time_ns()}.db"), model="baseline")
        offset = 0
        for path in self._fetch_shards(n):
            src = vd.open_source(path)
            with vd.Prefetcher(src, epochs=1, shuffle=False) as p:
                while (batch := p.next_batch(256)) is not None:
                    raw, _, ids = batch
                    with torch.no_grad():
                        labels, scores = softmax_postprocess(module(default_transform(raw)))
                    db.write_batch((ids + offset).tolist(), np.asarray(labels).tolist(), np.asarray(scores).tolist(), 1)
            offset += len(src)
        db.close()
        return {"bytes": self.wire_bytes() - b0, "seconds": time.time() - t0}

    def _finetune(self, tuner, stores, n: int, deadline: float) -> dict:
        from . import _ndsynth as synth
        from ._tuner import accuracy
        a = self.args
        out = {"stores": n, "epochs": a.epochs, "chunks": a.chunks, "local_epochs": a.local_epochs, "lr": self.lr}
        initial = synth.build().state_dict()
        for mode in ("non_pipelined", "pipelined"):
            tuner.module.load_state_dict(initial)
            self._all_refreshed(stores, tuner.publish().version, deadline)
            b0 = self.wire_bytes(by_host=True)
            report = tuner.finetune(a.epochs, a.chunks, pipelined=(mode == "pipelined"), timeout=300)
            b1 = self.wire_bytes(by_host=True)
            moved = sum(b1.values()) - sum(b0.values())
            self._all_refreshed(stores, tuner.publisher.announced_version, deadline)
            out[mode] = {"bytes_per_epoch": moved / a.epochs,
                         "bytes_sent_by_host": {h: b1[h] - b0.get(h, 0) for h in sorted(b1)}, "seconds": round(report["seconds"], 3),
                         "busy_fraction": round(report["busy_fraction"], 3), "fill_seconds": round(report["fill_seconds"], 3),
                         "busy_seconds": round(report["busy_seconds"], 3), "busy_cpu_seconds": round(report["busy_cpu_seconds"], 3),
                         "accuracy": accuracy(tuner.module, *self.test),
                         "process_cpu_seconds": round(report["process_cpu_seconds"], 3),
                         "tuner_rounds": report["timeline"],
                         "store_rounds": {st.name: [e for e in st.feature_rounds if e["job"] == report["job"]]
                                          for st in stores}}
            # The work per round on each side, in CPU time (what the load does not change): the
            # Tuner idles whenever the stores' extraction, all on the storage hosts' CPUs, takes
            # longer than its training.
            rounds = report["rounds"]
            out[mode]["tuner_cpu_per_round"] = round(report["busy_cpu_seconds"] / rounds, 4)
            out[mode]["stores_cpu_per_round"] = round(
                sum(e["cpu_seconds"] for ev in out[mode]["store_rounds"].values() for e in ev) / rounds, 4)
            out[mode]["tuner_wait_seconds"] = round(sum(t["wait"] for t in report["timeline"][1:]), 3)
            print(json.dumps({"finetune": mode, **{k: v for k, v in out[mode].items() if not k.endswith("_rounds")}}),
                  flush=True)
        out["baseline"] = self._baseline_finetune(n)
        print(json.dumps({"finetune": "baseline", **out["baseline"]}), flush=True)
        return out

    def _baseline_finetune(self, n: int) -> dict:
        import numpy as np
        import torch
        from . import _ndsynth as synth
        from . import data as vd
        from ._tuner import accuracy, make_optimizer, train_round
        from .neardata import default_transform
        a = self.args
        module = synth.build()
        optimizer = make_optimizer(module, self.lr)
        b0 = self.wire_bytes()
        t0 = time.time()
        for epoch in range(a.epochs):
            shards = []
            for path in self._fetch_shards(n):  # the raw samples cross the network every epoch
                src = vd.open_source(path)
                shards.append((np.stack([src.read(i) for i in range(len(src))]),
                               np.array([src.label(i) for i in range(len(src))], dtype=np.int64)))
            for c in range(a.chunks):
                k = epoch * a.chunks + c
                xs, ys = [], []
                for raw, labels in shards:
                    idx = np.array_split(np.arange(len(labels)), a.chunks)[c]
                    with torch.no_grad():
                        xs.append(module.backbone(default_transform(np.ascontiguousarray(raw[idx]))))
                    ys.append(torch.from_numpy(labels[idx]))
                train_round(module, optimizer, torch.cat(xs), torch.cat(ys), seed=a.seed, round_index=k, minibatch=64,
                            local_epochs=a.local_epochs)
        return {"bytes_per_epoch": (self.wire_bytes() - b0) / a.epochs, "seconds": round(time.time() - t0, 3),
                "accuracy": accuracy(module, *self.test)}


def _machine() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "load": os.getloadavg()[0],
            "kernel": platform.release()}


def _print_summary(r: dict) -> None:
    m = r["machine"]
    print(f"\nneardata bench on {m['host']} ({m['cpu']}, {m['cores']} cores, load {m['load']:.1f}); "
          f"{r['samples']} samples of {r['sample_bytes']} B; CPUs: compute {r['cpus']['compute']}, "
          f"storage {r['cpus']['storage']}")
    print("stores  relabel bytes near / baseline (ratio)      refresh s near / baseline")
    for row in r["relabel"]:
        print(f"{row['stores']:>6}  {row['near_bytes']:>10} / {row['baseline_bytes']:>10} ({100 * row['bytes_ratio']:.2f}%)"
              f"   {row['near_seconds']:>8} / {row['baseline_seconds']}")
    ft = r.get("finetune")
    if ft:
        base = ft["baseline"]
        print(f"fine-tuning ({ft['stores']} stores, {ft['epochs']} epochs x {ft['chunks']} rounds, {ft['local_epochs']} local "
              f"epochs, lr {ft['lr']:g}):")
        for mode in ("non_pipelined", "pipelined"):
            f = ft[mode]
            print(f"  {mode:>13}: {f['bytes_per_epoch']:.0f} B/epoch ({100 * f['bytes_per_epoch'] / base['bytes_per_epoch']:.2f}% "
                  f"of the baseline's), accuracy {100 * f['accuracy']:.1f}%, Tuner busy {100 * f['busy_fraction']:.1f}% "
                  f"({f['busy_seconds']} s, {f['busy_cpu_seconds']} s CPU), {f['seconds']} s; CPU per round: Tuner "
                  f"{1000 * f['tuner_cpu_per_round']:.0f} ms, stores {1000 * f['stores_cpu_per_round']:.0f} ms")
        print(f"       baseline: {base['bytes_per_epoch']:.0f} B/epoch, accuracy {100 * base['accuracy']:.1f}%, "
              f"{base['seconds']} s")
