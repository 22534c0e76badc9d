#!/usr/bin/python3
"""Continual-learning demo: one producer trains, one consumer serves; compare how versions travel.

    /usr/bin/python3 examples/cl_demo/run_demo.py [--model-mb 300] [--duration 40] [--json out.json]

Steps: (1) train version 0 on the t=0 distribution (cached in the work directory); (2) for each
transport, start a producer and a consumer process, give both the same start time, let the producer
train for --duration seconds on the drifting stream while publishing per the policy, and the
consumer serve one request every --request-interval seconds; (3) print a side-by-side table and
write every record to the JSON file.

Transports: "file" (torch.save + rename, the consumer polls the directory every --poll-interval
seconds and torch.load's), "viper" (the Viper Python bindings: memory path, push), "none"
(reference: no publishing, the consumer keeps version 0; gives the training speed without
publishing and the CIL of a never-updated model). The default runs file and viper; when
`import viper` fails it says so and runs none and file instead.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # examples/, for `import cl_demo`

from cl_demo.runtime import tune_malloc, write_json  # noqa: E402

tune_malloc()

import torch  # noqa: E402

from cl_demo.config import DemoConfig  # noqa: E402
from cl_demo.results import LABELS, format_table, summarize  # noqa: E402
from cl_demo.transports import viper_import_error  # noqa: E402


def parse_args(argv):
    d = DemoConfig()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-mb", type=float, default=d.dense_mb,
                    help="MiB of the wide dense weight (the model is slightly larger) [%(default)s]")
    ap.add_argument("--duration", type=float, default=d.duration_s, help="seconds per run [%(default)s]")
    ap.add_argument("--transports", default="auto",
                    help="comma-separated runs, in order, from none,file,viper; auto = file,viper, or "
                         "none,file when import viper fails [%(default)s]")
    ap.add_argument("--publish-every-s", type=float, default=d.publish_every_s,
                    help="publish when this many seconds passed since the last publish [%(default)s]")
    ap.add_argument("--publish-every-iters", type=int, default=d.publish_every_iters,
                    help="publish every this many iterations (with --publish-every-s: whichever first)")
    ap.add_argument("--poll-interval", type=float, default=d.poll_interval_s,
                    help="file transport: seconds between directory polls [%(default)s]")
    ap.add_argument("--file-dir", default="",
                    help="file transport: directory of the model files, e.g. a PFS mount or /dev/shm "
                         "(emptied before and after the run) [WORKDIR/run-file/models]")
    ap.add_argument("--request-interval", type=float, default=d.request_interval_s,
                    help="seconds between inference requests [%(default)s]")
    ap.add_argument("--request-batch", type=int, default=d.request_batch, help="samples per request [%(default)s]")
    ap.add_argument("--period", type=float, default=d.period_s,
                    help="seconds per full turn of the drifting decision boundary [%(default)s]")
    ap.add_argument("--train-batch", type=int, default=d.train_batch, help="[%(default)s]")
    ap.add_argument("--lr", type=float, default=d.lr, help="SGD learning rate [%(default)s]")
    ap.add_argument("--pretrain-iters", type=int, default=d.pretrain_iters, help="[%(default)s]")
    ap.add_argument("--seed", type=int, default=d.train_seed, help="training seed [%(default)s]")
    ap.add_argument("--workdir", default="/tmp/viper-cl-demo",
                    help="version-0 cache, logs, per-run files [%(default)s]")
    ap.add_argument("--json", default=None, help="results file [WORKDIR/results.json]")
    ap.add_argument("--viper-path", default=None, help="directory to add to PYTHONPATH for `import viper`")
    ap.add_argument("--require-viper", action="store_true", help="fail instead of skipping viper")
    return ap.parse_args(argv)


def config_from_args(args) -> DemoConfig:
    return DemoConfig(dense_mb=args.model_mb, duration_s=args.duration, period_s=args.period,
                      train_seed=args.seed, train_batch=args.train_batch, lr=args.lr,
                      pretrain_iters=args.pretrain_iters, publish_every_s=args.publish_every_s,
                      publish_every_iters=args.publish_every_iters,
                      request_interval_s=args.request_interval, request_batch=args.request_batch,
                      poll_interval_s=args.poll_interval, file_dir=args.file_dir)


def version0(cfg: DemoConfig, workdir: str) -> dict:
    """Makes (or reuses) the pretrained version 0; sets cfg.init_path. Returns what it did."""
    keys = {k: getattr(cfg, k) for k in ("dense_mb", "period_s", "noise", "data_seed", "train_seed",
                                         "lr", "pretrain_iters", "pretrain_batch", "classes")}
    keys["torch"] = torch.__version__
    for source in ("model.py", "data.py", "producer.py"):  # the code that makes version 0
        with open(os.path.join(HERE, source), "rb") as f:
            keys[source] = hashlib.sha256(f.read()).hexdigest()
    digest = hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]
    cfg.init_path = os.path.join(workdir, f"version0-{digest}.pt")
    if os.path.exists(cfg.init_path):
        return {"cached": True, "path": cfg.init_path}
    from cl_demo.producer import pretrain  # noqa: PLC0415 (imports the training code only when needed)
    torch.set_num_threads(1)  # 2 OpenMP threads lose badly when the cores are shared
    start = time.perf_counter()
    info = pretrain(cfg, cfg.init_path)
    info.update({"cached": False, "path": cfg.init_path, "wall_s": time.perf_counter() - start})
    return info


def child_env(viper_path) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["OPENBLAS_NUM_THREADS"] = "1"
    if viper_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (viper_path, env.get("PYTHONPATH")) if p)
    return env


def run_one(name: str, cfg: DemoConfig, workdir: str, viper_path, transport: str = "",
            stop_consumer_with_producer: bool = False) -> dict:
    """One run (directory run-<name>): producer + consumer processes on a shared start time, moving
    versions by `transport` (default: the transport called `name`). Returns their JSON records.
    stop_consumer_with_producer: the consumer stops serving when the producer exits (a run bounded
    by cfg.max_iterations rather than by its duration)."""
    transport = transport or name
    rundir = os.path.join(workdir, f"run-{name}")
    shutil.rmtree(rundir, ignore_errors=True)
    os.makedirs(rundir)
    _remove_models(cfg, rundir)
    cfg.viper_address = "127.0.0.1:0"  # the producer's node picks the port (ViperTransport)
    cfg_path = os.path.join(rundir, "config.json")
    cfg.save(cfg_path)
    procs = {}
    t0 = time.perf_counter()
    try:
        for role in ("producer", "consumer"):
            procs[role] = _spawn(role, transport, cfg_path, rundir, viper_path)
        for role, p in procs.items():
            _expect_ready(role, p, rundir, deadline=time.monotonic() + 180)
        phases = {"startup_s": time.perf_counter() - t0}
        start_ns = time.time_ns() + 300_000_000
        for p in procs.values():
            p.stdin.write(f"START {start_ns}\n")
            p.stdin.flush()
        for role, p in procs.items():
            rc = p.wait(timeout=cfg.duration_s + 120)
            if rc != 0:
                raise RuntimeError(f"{name} run: {role} exited with {rc}\n{_tail(rundir, role)}")
            if role == "producer" and stop_consumer_with_producer:
                procs["consumer"].stdin.write("STOP\n")
                procs["consumer"].stdin.flush()
        phases["after_duration_s"] = (time.time_ns() - start_ns) / 1e9 - cfg.duration_s
        records = {"phases": phases}
        for role in procs:
            with open(os.path.join(rundir, f"{role}.json"), encoding="utf-8") as f:
                records[role] = json.load(f)
        return records
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        _remove_models(cfg, rundir)


def _remove_models(cfg: DemoConfig, rundir: str) -> None:
    """Removes the file transport's model files (only ours: model-*.pt and their .tmp)."""
    directory = cfg.file_dir or os.path.join(rundir, "models")
    if not os.path.isdir(directory):
        return
    for entry in os.listdir(directory):
        if entry.startswith("model-") and (entry.endswith(".pt") or entry.endswith(".pt.tmp")):
            os.unlink(os.path.join(directory, entry))


def _spawn(role: str, transport: str, cfg_path: str, rundir: str, viper_path) -> subprocess.Popen:
    log = open(os.path.join(rundir, f"{role}.log"), "w", encoding="utf-8")  # noqa: SIM115 (child owns it)
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, f"{role}.py"), "--config", cfg_path, "--transport", transport,
         "--workdir", rundir, "--out", os.path.join(rundir, f"{role}.json")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=child_env(viper_path))


def _expect_ready(role: str, p: subprocess.Popen, rundir: str, deadline: float) -> None:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"{role} did not get ready in time\n{_tail(rundir, role)}")
        ready, _, _ = select.select([p.stdout], [], [], min(left, 1.0))
        if ready:
            line = p.stdout.readline()
            if line.strip() == "READY":
                return
            if line == "" and p.poll() is not None:
                raise RuntimeError(f"{role} exited with {p.returncode} before READY\n{_tail(rundir, role)}")


def _tail(rundir: str, role: str, lines: int = 30) -> str:
    try:
        with open(os.path.join(rundir, f"{role}.log"), encoding="utf-8") as f:
            return f"--- {role}.log (last {lines} lines) ---\n" + "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"(no {role}.log: {e})"


def main(argv=None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        raise SystemExit(f"run_demo: {e}") from e
    auto = args.transports == "auto"
    names = ["file", "viper"] if auto else [n.strip() for n in args.transports.split(",") if n.strip()]
    unknown = [n for n in names if n not in LABELS]
    if unknown or not names:
        raise SystemExit(f"--transports: unknown {unknown}; choose from none, file, viper")
    if args.viper_path:
        sys.path.insert(0, args.viper_path)
    viper_error = viper_import_error() if "viper" in names else None
    if viper_error:
        if args.require_viper:
            raise SystemExit(f"--require-viper: import viper failed: {viper_error}")
        names.remove("viper")
        if auto:
            names.insert(0, "none")
        print(f"NOTE: viper is not run: import viper failed ({viper_error}).\n"
              f"      Running {', '.join(names)} only (the baseline"
              f"{' against the no-update reference' if auto else ''}). Build the Python bindings and\n"
              f"      put them on PYTHONPATH (or pass --viper-path) to compare.", flush=True)
    if not names:
        raise SystemExit("run_demo: nothing to run (only viper was asked for and it is not importable)")
    os.makedirs(args.workdir, exist_ok=True)
    json_path = args.json or os.path.join(args.workdir, "results.json")
    load_at_start = os.getloadavg()

    t0 = time.perf_counter()
    pre = version0(cfg, args.workdir)
    pretrain_s = time.perf_counter() - t0
    print(f"version 0: {'reused ' if pre['cached'] else 'trained '}{pre['path']} ({pretrain_s:.1f} s)", flush=True)

    runs, run_wall = {}, {}
    for name in names:
        t0 = time.perf_counter()
        print(f"run {name}: {LABELS[name]}, {cfg.duration_s:.0f} s ...", flush=True)
        try:
            runs[name] = run_one(name, cfg, args.workdir, args.viper_path)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"run_demo: the {name} run failed: {e}", file=sys.stderr)
            return 1
        run_wall[name] = time.perf_counter() - t0
    summaries = {}
    reference = None
    if "none" in runs:
        reference = summaries["none"] = summarize(runs["none"]["producer"], runs["none"]["consumer"])
    for name in names:
        if name != "none":
            summaries[name] = summarize(runs[name]["producer"], runs[name]["consumer"], reference)
    summaries = {n: summaries[n] for n in names}

    print()
    print(format_table(summaries))
    total_s = time.perf_counter() - t_start
    print(f"\nwall time: {total_s:.1f} s (version 0: {pretrain_s:.1f} s; runs: "
          + ", ".join(f"{n} {s:.1f} s" for n, s in run_wall.items()) + ")")
    write_json(json_path, {
        "config": cfg.to_dict(), "transports": names,
        "viper": {"available": viper_error is None and "viper" in names, "error": viper_error},
        "version0": pre, "summaries": summaries, "runs": runs,
        "timing": {"total_s": total_s, "version0_s": pretrain_s, "run_wall_s": run_wall},
        "host": {"cpus": os.cpu_count(), "loadavg_at_start": load_at_start, "torch": torch.__version__},
    })
    print(f"results: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
