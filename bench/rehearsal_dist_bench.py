#!/usr/bin/python3
"""The distributed rehearsal buffer's benchmark (docs/BENCHMARKS.md "Distributed rehearsal"):
forgetting with viper.data.DistributedRehearsalBuffer spread over data-parallel ranks against one
RehearsalBuffer of the same total capacity, on the same task sequence; and the time mix() takes
per step with remote draws against local-only draws.

    PYTHONPATH=build/python /usr/bin/python3 bench/rehearsal_dist_bench.py --ranks 2,4 --seeds 3 --json /tmp/r.json

The task sequence is the demo's rehearsal stage (examples/cl_demo/run_rehearsal.py): --tasks tasks
of two new classes each (class-incremental), record files read with viper.data.DataLoader; a
two-layer MLP, SGD with momentum, --steps-per-task steps per task, a global batch of --batch new
samples plus --ratio as many rehearsal samples. Runs, each from the same initial model and seed:

  single   one process, batch --batch, one RehearsalBuffer of --capacity samples;
  dist     n rank processes (torch.distributed, gloo: gradients averaged over the ranks, so every
           rank holds the same model), each reading its share of each task (DataLoader(rank,
           world_size)) in batches of --batch / n, each with a SampleCache node on loopback and a
           DistributedRehearsalBuffer of --capacity in all (capacity / n per shard, UCX between the
           nodes); mix() draws from the global buffer;
  replica  the same n ranks with one buffer of --capacity: every rank holds the same buffer (same
           seed; every rank's batch added, in rank order, through an all-gather), draws n times
           its share as one buffer would and takes its part: a single buffer in the same
           data-parallel training;
  local    the same n ranks, each with its own RehearsalBuffer of --capacity / n and local draws
           only: the mix() time without remote draws, in the same setting.

Figures: forgetting (best accuracy an old task ever had minus its final accuracy, averaged over
the old tasks) and accuracy on the old tasks after the last task, per seed and mean; per step of
mix(): the time in mix() and (dist) the wait for a prefetch still in flight.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from loopback_ports import free_ports

PY = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "cl_demo"))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4", help="rank counts of the distributed runs [%(default)s]")
    ap.add_argument("--seeds", type=int, default=3, help="seeds (7, 8, ...) [%(default)s]")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--train-per-class", type=int, default=600)
    ap.add_argument("--test-per-class", type=int, default=300)
    ap.add_argument("--steps-per-task", type=int, default=150)
    ap.add_argument("--batch", type=int, default=32, help="global batch of new samples [%(default)s]")
    ap.add_argument("--ratio", type=float, default=1.0)
    ap.add_argument("--capacity", type=int, default=400)
    ap.add_argument("--policy", default="class_balanced", choices=["class_balanced", "reservoir"])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--noise", type=float, default=3.0)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--pack", type=int, default=64, help="DistributedRehearsalBuffer pack [%(default)s]")
    ap.add_argument("--modes", default="single,dist,replica,local")
    ap.add_argument("--workdir", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--_rank", type=int, default=-1, help=argparse.SUPPRESS)  # a rank process
    ap.add_argument("--_world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--_mode", default="", help=argparse.SUPPRESS)
    ap.add_argument("--_seed", type=int, default=7, help=argparse.SUPPRESS)
    ap.add_argument("--_nodes", default="", help=argparse.SUPPRESS)
    ap.add_argument("--_port", type=int, default=0, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def replica_mix(buf, x, y, rank: int, world: int, ratio: float):
    """One buffer of the whole capacity in data-parallel training: every rank holds the same
    buffer (same seed, every rank's batch added in rank order), draws world * k samples as one
    buffer would, and takes its k of them."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    k = int(round(len(x) * ratio))
    old_x, old_y = buf.sample(k * world) if len(buf) else (None, None)
    xs, ys = [torch.empty_like(x) for _ in range(world)], [torch.empty_like(y) for _ in range(world)]
    dist.all_gather(xs, x.contiguous())
    dist.all_gather(ys, y.contiguous())
    for xr, yr in zip(xs, ys):
        buf.add(xr, yr)
    if old_x is None:
        return x, y
    mine = slice(rank * len(old_y) // world, (rank + 1) * len(old_y) // world)
    return torch.cat([x, old_x[mine].to(x.dtype)]), torch.cat([y, old_y[mine].to(y.dtype)])


def run_rank(args) -> dict:
    """One training process: single (world 1, one buffer), dist or local (a rank of --_world)."""
    import torch  # noqa: PLC0415
    import viper.data as vd  # noqa: PLC0415
    import run_rehearsal as demo  # noqa: PLC0415
    torch.set_num_threads(1)
    rank, world, mode, seed = args._rank, args._world, args._mode, args._seed
    stream = demo.TaskStream(2 * args.tasks, args.width, args.noise, seed)
    tests = [stream.samples(k, args.test_per_class, split=1) for k in range(args.tasks)]
    data_dir = os.path.join(args.workdir, f"tasks-{seed}")
    if world > 1:
        import torch.distributed as dist  # noqa: PLC0415
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args._port}", rank=rank, world_size=world)
    cache = None
    if mode == "dist":
        cache = vd.SampleCache(vd.callable_source(lambda i: bytes(8), [8]), args._nodes.split(","), rank,
                               token="bench", timeout=10.0)
        buf = vd.DistributedRehearsalBuffer(args.capacity, cache=cache, sample_shape=(args.width,), dtype="float32",
                                            ratio=args.ratio, policy=args.policy, seed=seed, pack=args.pack,
                                            spill_dir=os.path.join(args.workdir, f"spill-{mode}-{world}-{seed}"))
    else:
        cap = args.capacity // world if mode == "local" else args.capacity
        buf = vd.RehearsalBuffer(cap, sample_shape=(args.width,), dtype="float32", ratio=args.ratio,
                                 policy=args.policy, seed=seed * 1000003 + (rank if mode == "local" else 0),
                                 spill_dir=os.path.join(args.workdir, f"spill-{mode}-{world}-{seed}-{rank}"))
    if world > 1:
        dist.barrier()
    model = demo.make_model(args.width, 2 * args.tasks, seed)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    as_float = lambda x: x.view(torch.float32).reshape(-1, args.width)  # noqa: E731
    matrix, mix_s, steps = [], 0.0, 0
    for k in range(args.tasks):
        loader = vd.DataLoader(os.path.join(data_dir, f"task-{k}.vrec"), batch_size=args.batch // world,
                               drop_last=True, seed=seed + k, rank=rank, world_size=world, batch_transform=as_float)
        step = 0
        while step < args.steps_per_task:
            for x, y in loader:
                t0 = time.perf_counter()
                x, y = replica_mix(buf, x, y, rank, world, args.ratio) if mode == "replica" else buf.mix(x, y)
                mix_s += time.perf_counter() - t0
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                if world > 1:
                    for p in model.parameters():
                        dist.all_reduce(p.grad)
                        p.grad /= world
                opt.step()
                step += 1
                steps += 1
                if step == args.steps_per_task:
                    break
        loader.close()
        buf.spill()
        matrix.append([demo.accuracy(model, *tests[j]) if j <= k else None for j in range(args.tasks)])
    out = {"mode": mode, "world": world, "rank": rank, "seed": seed, "matrix": matrix, "steps": steps,
           "mix_ms_per_step": 1e3 * mix_s / steps}
    out.update(demo.summary(matrix))
    if mode == "dist":
        st = buf.stats()
        out["wait_ms_per_step"] = 1e3 * st["wait_seconds"] / max(1, st["mixes"])
        out["wait_max_ms"] = 1e3 * st["wait_max_seconds"]
        out["remote_share"] = st["remote_draws"] / max(1, st["remote_draws"] + st["local_draws"])
        out["fetched_kb_per_step"] = st["fetched_bytes"] / 1e3 / max(1, st["mixes"])
        out["stale_packs"] = st["stale_packs"]
        out["fetch_failures"] = st["fetch_failures"]
    if world > 1:
        dist.barrier()  # no node goes away while another rank may still fetch from it
    buf.close()
    if cache is not None:
        cache.close()
    return out


def launch(args, mode: str, world: int, seed: int) -> list:
    *node_ports, port = free_ports(world + 1)  # the nodes' ports and gloo's, all distinct
    nodes = ",".join(f"127.0.0.1:{p}" for p in node_ports)
    base = [PY, os.path.abspath(__file__), "--workdir", args.workdir, "--_world", str(world), "--_mode", mode,
            "--_seed", str(seed), "--_nodes", nodes, "--_port", str(port)]
    for name in ("tasks", "train_per_class", "test_per_class", "steps_per_task", "batch", "ratio", "capacity",
                 "policy", "width", "noise", "lr", "pack"):
        base += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    procs = [subprocess.Popen(base + ["--_rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = []
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=1200)
        if p.returncode != 0:
            raise SystemExit(f"{mode} world {world} seed {seed} rank {r} failed:\n{err[-3000:]}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def write_tasks(args, seed: int) -> None:
    import viper.data as vd  # noqa: PLC0415
    import run_rehearsal as demo  # noqa: PLC0415
    d = os.path.join(args.workdir, f"tasks-{seed}")
    os.makedirs(d, exist_ok=True)
    stream = demo.TaskStream(2 * args.tasks, args.width, args.noise, seed)
    for k in range(args.tasks):
        x, y = stream.samples(k, args.train_per_class, split=0)
        vd.write_records(os.path.join(d, f"task-{k}.vrec"), zip(x, y))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args._rank >= 0:
        print(json.dumps(run_rank(args)), flush=True)
        return 0
    own_dir = not args.workdir
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="viper-rehearsal-bench-")
    ranks = [int(r) for r in args.ranks.split(",") if r]
    modes = [m for m in args.modes.split(",") if m]
    for n in ranks:
        if args.batch % n or args.capacity % n:
            raise SystemExit(f"--batch {args.batch} and --capacity {args.capacity} must divide by {n} ranks")
    t0 = time.time()
    runs = []
    for i in range(args.seeds):
        seed = 7 + i
        write_tasks(args, seed)
        if "single" in modes:
            runs += launch(args, "single", 1, seed)
        for n in ranks:
            for mode in ("dist", "replica", "local"):
                if mode in modes:
                    runs += launch(args, mode, n, seed)
        done = [r for r in runs if r["seed"] == seed and r["rank"] == 0]
        print(f"seed {seed}: " + "; ".join(f"{r['mode']} x{r['world']} forgetting {r['forgetting']:.3f} old "
                                          f"{r['old_tasks']:.3f}" for r in done), flush=True)

    def rows(mode, world):
        return [r for r in runs if r["mode"] == mode and r["world"] == world]

    print(f"\nDistributed rehearsal: {args.tasks} tasks of 2 classes, {args.steps_per_task} steps each, global batch "
          f"{args.batch} new + {args.ratio:g}x rehearsal, {args.policy} buffer of {args.capacity} in all; "
          f"{args.seeds} seeds")
    print(f"{'run':<22}{'forgetting':>12}{'old tasks':>11}{'new task':>10}{'mix ms/step':>13}{'wait ms/step':>14}"
          f"{'remote draws':>14}")
    summary = {}
    for mode, world in [("single", 1)] + [(m, n) for n in ranks for m in ("dist", "replica", "local")]:
        rs = rows(mode, world)
        if not rs:
            continue
        lead = [r for r in rs if r["rank"] == 0]
        f = float(np.mean([r["forgetting"] for r in lead]))
        old = float(np.mean([r["old_tasks"] for r in lead]))
        new = float(np.mean([r["new_task"] for r in lead]))
        mix = float(np.mean([r["mix_ms_per_step"] for r in rs]))
        wait = float(np.mean([r["wait_ms_per_step"] for r in rs])) if mode == "dist" else 0.0
        remote = float(np.mean([r["remote_share"] for r in rs])) if mode == "dist" else 0.0
        label = {"single": "single buffer", "dist": f"distributed x{world}", "replica": f"one buffer x{world}",
                 "local": f"local x{world}"}[mode]
        print(f"{label:<22}{f:>12.3f}{old:>11.3f}{new:>10.3f}{mix:>13.2f}{wait:>14.2f}{remote:>13.0%}")
        summary[f"{mode}{world}"] = {"forgetting": f, "old_tasks": old, "new_task": new, "mix_ms_per_step": mix,
                                     "wait_ms_per_step": wait, "remote_share": remote,
                                     "forgetting_per_seed": [r["forgetting"] for r in lead]}
    for n in ranks:
        for base in ("single1", f"replica{n}"):
            if f"dist{n}" not in summary or base not in summary:
                continue
            per_seed = np.subtract(summary[f"dist{n}"]["forgetting_per_seed"], summary[base]["forgetting_per_seed"])
            se = float(per_seed.std(ddof=1) / np.sqrt(len(per_seed))) if len(per_seed) > 1 else float("nan")
            summary[f"dist{n}"][f"minus_{base}"] = float(per_seed.mean())
            summary[f"dist{n}"][f"minus_{base}_se"] = se
            name = "one buffer, one process" if base == "single1" else f"one buffer, x{n} ranks"
            print(f"forgetting, distributed x{n} - {name}: {per_seed.mean():+.3f} (standard error {se:.3f}; "
                  f"per seed {' '.join(f'{d:+.3f}' for d in per_seed)}; target: within 0.02)")
    out = {"args": {k: v for k, v in vars(args).items() if not k.startswith("_")}, "runs": runs, "summary": summary,
           "wall_s": time.time() - t0}
    if args.json:
        with open(args.json + ".tmp", "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    print(f"{time.time() - t0:.0f} s in all")
    if own_dir:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
