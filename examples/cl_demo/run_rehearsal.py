#!/usr/bin/python3
"""Rehearsal against catastrophic forgetting, on data that arrives as a stream (issue 17,
docs/DEMO.md "Rehearsal").

    /usr/bin/python3 examples/cl_demo/run_rehearsal.py [--tasks 4] [--json out.json]
    scripts/demo.sh --stages rehearsal      (the demo's stage; --rehearsal-args "..." for options)

The stream: --tasks tasks arrive one after another, each as a record file written atomically into
<workdir>/run-rehearsal/stream/ (viper.data.write_records) by a producer thread; task k
brings two new classes (class-incremental learning: 2 * tasks classes in all, one shared output
layer). The trainer reads each task's file through viper.data.DataLoader (the auto-tuned
prefetcher) and trains --steps-per-task SGD steps on it, twice, with the same seeds and files:

  without rehearsal   each batch holds only the current task's samples;
  with rehearsal      each batch of new samples gets --ratio as many old ones from a
                      viper.data.RehearsalBuffer (class-balanced, --capacity samples), which is
                      spilled to <workdir>/run-rehearsal/spill/ after each task and reopened
                      (restored, validated) before the next one, as a restarted job would.

After each task both models are tested on every task seen so far (held-out samples). Printed:
accuracy on the old tasks and on the newest task after the last one, and the forgetting (best
accuracy a task ever had minus its final accuracy, averaged over the old tasks).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time

import numpy as np
import torch

vd = None  # viper.data, imported by main() (after --viper-path)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=4, help="tasks in the stream (2 new classes each) [%(default)s]")
    ap.add_argument("--train-per-class", type=int, default=600, help="training samples per class [%(default)s]")
    ap.add_argument("--test-per-class", type=int, default=300, help="held-out samples per class [%(default)s]")
    ap.add_argument("--steps-per-task", type=int, default=150, help="SGD steps on each task [%(default)s]")
    ap.add_argument("--batch", type=int, default=32, help="new samples per batch [%(default)s]")
    ap.add_argument("--ratio", type=float, default=1.0, help="rehearsal samples per new sample [%(default)s]")
    ap.add_argument("--capacity", type=int, default=400, help="rehearsal buffer size, samples [%(default)s]")
    ap.add_argument("--policy", default="class_balanced", choices=["class_balanced", "reservoir"])
    ap.add_argument("--width", type=int, default=256, help="signal length (float32 values per sample) [%(default)s]")
    ap.add_argument("--noise", type=float, default=3.0, help="std of the white noise on each value [%(default)s]")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", default="/tmp/viper-cl-demo", help="[%(default)s]")
    ap.add_argument("--json", default="", help="results file [<workdir>/rehearsal.json]")
    ap.add_argument("--viper-path", default=None, help="directory to add to PYTHONPATH for `import viper`")
    args = ap.parse_args(argv)
    if args.tasks < 2:
        ap.error("--tasks must be >= 2 (forgetting needs an old task)")
    return args


class TaskStream:
    """Class prototypes (smooth random signals) and noisy samples of them, all from seeds."""

    def __init__(self, classes: int, width: int, noise: float, seed: int):
        g = np.random.default_rng(seed)
        pos = np.arange(width) / width
        protos = []
        for _ in range(classes):
            f = g.integers(1, 12, size=3)
            ph = g.uniform(0, 2 * np.pi, size=3)
            protos.append(sum(np.sin(2 * np.pi * fi * pos + p) for fi, p in zip(f, ph)))
        self.protos = np.stack(protos).astype(np.float32)
        self.width, self.noise, self.seed = width, noise, seed

    def samples(self, task: int, per_class: int, split: int):
        """(x [n, width] float32, y [n] int64) of task `task`'s two classes, shuffled."""
        g = np.random.default_rng([self.seed, task, split])
        ys = np.repeat(np.array([2 * task, 2 * task + 1]), per_class)
        g.shuffle(ys)
        x = self.protos[ys] + self.noise * g.standard_normal((len(ys), self.width)).astype(np.float32)
        return x.astype(np.float32), ys.astype(np.int64)


def publish_stream(stream: TaskStream, args, stream_dir: str, arrived: list) -> None:
    """The data producer: writes task k's training file (atomically) and announces it."""
    for k in range(args.tasks):
        x, y = stream.samples(k, args.train_per_class, split=0)
        path = os.path.join(stream_dir, f"task-{k}.vrec")
        vd.write_records(path, zip(x, y))
        arrived[k].set()


def make_model(width: int, classes: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(width, 128), torch.nn.ReLU(), torch.nn.Linear(128, classes))


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1) == torch.from_numpy(y)).float().mean())


def train(args, stream: TaskStream, rehearsal: bool, arrived: list, stream_dir: str, tests: list) -> dict:
    """One run over the stream; returns the accuracy matrix acc[after task i][on task j]."""
    model = make_model(args.width, 2 * args.tasks, args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    spill_dir = os.path.join(args.workdir, "run-rehearsal", "spill")
    shutil.rmtree(spill_dir, ignore_errors=True)
    matrix, restored, waits = [], [], 0.0
    as_float = lambda x: x.view(torch.float32).reshape(-1, args.width)  # noqa: E731
    for k in range(args.tasks):
        arrived[k].wait()
        buf = None
        if rehearsal:  # reopened for every task: restored from the spill of the one before
            buf = vd.RehearsalBuffer(args.capacity, sample_shape=(args.width,), dtype="float32", ratio=args.ratio,
                                     policy=args.policy, seed=args.seed, spill_dir=spill_dir)
            restored.append(len(buf))
        loader = vd.DataLoader(os.path.join(stream_dir, f"task-{k}.vrec"), batch_size=args.batch, drop_last=True,
                               seed=args.seed + k, batch_transform=as_float)
        step = 0
        while step < args.steps_per_task:
            for x, y in loader:
                if buf is not None:
                    x, y = buf.mix(x, y)
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
                step += 1
                if step == args.steps_per_task:
                    break
        waits += loader.stats()["consumer_wait_seconds"]
        loader.close()
        if buf is not None:
            buf.spill()
            buf.close()
        matrix.append([accuracy(model, *tests[j]) if j <= k else None for j in range(args.tasks)])
    return {"matrix": matrix, "restored_sizes": restored, "loader_wait_s": waits}


def summary(matrix: list) -> dict:
    last = matrix[-1]
    old = [last[j] for j in range(len(last) - 1)]
    best = [max(matrix[i][j] for i in range(j, len(matrix))) for j in range(len(last) - 1)]
    return {"old_tasks": float(np.mean(old)), "new_task": last[-1],
            "forgetting": float(np.mean([b - a for b, a in zip(best, old)]))}


def main(argv=None) -> int:
    global vd
    args = parse_args(argv)
    if args.viper_path:
        sys.path.insert(0, args.viper_path)
    import viper.data  # noqa: PLC0415
    vd = viper.data
    t0 = time.time()
    stream_dir = os.path.join(args.workdir, "run-rehearsal", "stream")
    shutil.rmtree(stream_dir, ignore_errors=True)
    os.makedirs(stream_dir)
    torch.set_num_threads(1)
    stream = TaskStream(2 * args.tasks, args.width, args.noise, args.seed)
    tests = [stream.samples(k, args.test_per_class, split=1) for k in range(args.tasks)]
    arrived = [threading.Event() for _ in range(args.tasks)]
    producer = threading.Thread(target=publish_stream, args=(stream, args, stream_dir, arrived), daemon=True)
    producer.start()
    runs = {}
    for name, rehearsal in (("without rehearsal", False), ("with rehearsal", True)):
        runs[name] = train(args, stream, rehearsal, arrived, stream_dir, tests)
        runs[name].update(summary(runs[name]["matrix"]))
    producer.join()

    print(f"Rehearsal: {args.tasks} tasks of 2 new classes each arrive as record files; {args.steps_per_task} "
          f"steps of {args.batch} new samples per task; rehearsal: {args.policy} buffer of {args.capacity}, "
          f"{args.ratio:g} old sample(s) per new one")
    print(f"{'':<20}{'old tasks':>10}{'new task':>10}{'forgetting':>12}   accuracy on task 0..{args.tasks - 1} after the last")
    for name, r in runs.items():
        row = " ".join(f"{a:.2f}" for a in r["matrix"][-1])
        print(f"{name:<20}{r['old_tasks']:>10.2f}{r['new_task']:>10.2f}{r['forgetting']:>12.2f}   {row}")
    with_r = runs["with rehearsal"]
    print(f"rehearsal buffer restored from its spill before tasks 1..{args.tasks - 1} with "
          f"{with_r['restored_sizes'][1:]} samples; {time.time() - t0:.1f} s in all")
    out = {"args": vars(args), "runs": runs, "wall_s": time.time() - t0}
    path = args.json or os.path.join(args.workdir, "rehearsal.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
