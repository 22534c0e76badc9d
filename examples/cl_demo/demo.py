#!/usr/bin/python3
"""The continual-learning demo: its stages, one after the other (scripts/demo.sh runs this).

    /usr/bin/python3 examples/cl_demo/demo.py [--stages transports,policies] [--workdir DIR] [--json FILE]
                                               [--transports-args "--duration 30"] [--policies-args "..."]

A stage is a module of this package with `main(argv) -> int` that accepts `--workdir DIR` and
`--json FILE` (its results) and prints its own table. They share the work directory (version-0
caches, per-run directories) and nothing else, so a stage can be added beside the others by one
line in STAGES (docs/DEMO.md, "Stages").
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # examples/, for `import cl_demo`

# name -> (module, what it shows, arguments it always gets)
STAGES = {
    "transports": ("cl_demo.run_demo", "file + poll vs Viper: update latency, stall, CIL", ["--require-viper"]),
    "policies": ("cl_demo.run_policies", "epoch vs fixed interval vs IPP online: predicted and measured CIL", []),
    "rehearsal": ("cl_demo.run_rehearsal", "a stream of new classes with and without a rehearsal buffer: forgetting", []),
    "neardata": ("cl_demo.run_neardata", "storage hosts relabel and extract features near the data: bytes moved", []),
}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated, in order [%(default)s]")
    ap.add_argument("--workdir", default="/tmp/viper-cl-demo", help="[%(default)s]")
    ap.add_argument("--json", default=None, help="one file with every stage's results [WORKDIR/demo.json]")
    ap.add_argument("--viper-path", default=None, help="directory to add to PYTHONPATH for `import viper`")
    for name in STAGES:
        ap.add_argument(f"--{name}-args", default="", help=f"more options for the {name} stage (one string)")
    args = ap.parse_args(argv)
    args.stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in args.stages if s not in STAGES]
    if unknown or not args.stages:
        ap.error(f"--stages: unknown {unknown}; choose from {','.join(STAGES)}")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.workdir, exist_ok=True)
    started = time.perf_counter()
    results, walls = {}, {}
    for name in args.stages:
        module, what, always = STAGES[name]
        out = os.path.join(args.workdir, f"{name}.json")
        stage_argv = always + ["--workdir", args.workdir, "--json", out]
        if args.viper_path:
            stage_argv += ["--viper-path", args.viper_path]
        stage_argv += shlex.split(getattr(args, f"{name}_args"))
        print(f"=== stage {name}: {what}", flush=True)
        t0 = time.perf_counter()
        rc = importlib.import_module(module).main(stage_argv)
        walls[name] = time.perf_counter() - t0
        if rc != 0:
            print(f"demo: stage {name} failed ({rc})", file=sys.stderr)
            return rc
        with open(out, encoding="utf-8") as f:
            results[name] = json.load(f)
        print(flush=True)
    total = time.perf_counter() - started
    print(f"demo: {', '.join(f'{n} {s:.0f} s' for n, s in walls.items())}; {total:.0f} s in all")
    path = args.json or os.path.join(args.workdir, "demo.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"stages": results, "wall_s": walls, "total_s": total}, f)
    os.replace(path + ".tmp", path)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
