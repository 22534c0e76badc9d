#!/usr/bin/python3
"""The same continual-learning run under different checkpoint schedules (issue 6, docs/DEMO.md).

    /usr/bin/python3 examples/cl_demo/run_schedules.py [--schedules epoch,fixed,optimal] [--duration 30]

For each schedule, a producer and a consumer run exactly as in run_demo.py (same model, stream,
seeds, request times) with the Viper transport, but the producer publishes when the Inference
Performance Predictor says so (cl_demo.policy.IppPolicy: a viper.Scheduler made at the end of a
short warm-up from the losses, the time per iteration and the stalls measured so far). Printed per
schedule: the checkpoints taken, the CIL the IPP predicted for that schedule (from the training-loss
curve it fitted), the CIL it predicted for every other policy on the same fit, and the CIL the
consumer measured (the sum of its request losses).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from cl_demo.results import summarize  # noqa: E402
from cl_demo.run_demo import config_from_args, parse_args as demo_args, run_one, version0  # noqa: E402
from cl_demo.transports import viper_import_error  # noqa: E402

POLICIES = ("epoch", "fixed", "greedy", "sqrt", "optimal")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", default="epoch,fixed,optimal",
                    help=f"comma-separated, from {','.join(POLICIES)} [%(default)s]")
    ap.add_argument("--warmup-iters", type=int, default=40, help="s: IPP warm-up iterations [%(default)s]")
    ap.add_argument("--epoch-iters", type=int, default=0, help="epoch schedule: iterations per epoch "
                                                                "(0 = a quarter of the planned run) [%(default)s]")
    ap.add_argument("--t-p", type=float, default=0.1, help="initial estimate of t_p, seconds [%(default)s]")
    ap.add_argument("--t-c", type=float, default=0.5, help="estimate of t_c, seconds [%(default)s]")
    args, rest = ap.parse_known_args(argv)
    schedules = [s for s in args.schedules.split(",") if s]
    bad = [s for s in schedules if s not in POLICIES]
    if bad or not schedules:
        ap.error(f"--schedules: unknown {bad}; choose from {','.join(POLICIES)}")
    if "--duration" not in rest:
        rest += ["--duration", "30"]
    return args, schedules, demo_args(rest)


def main(argv=None) -> int:
    args, schedules, demo = parse_args(sys.argv[1:] if argv is None else argv)
    err = viper_import_error()
    if err is not None:
        print(f"run_schedules: the IPP needs the viper bindings: {err}", file=sys.stderr)
        return 2
    cfg = config_from_args(demo)
    cfg.schedule_warmup_iters = args.warmup_iters
    cfg.schedule_epoch_iters = args.epoch_iters
    cfg.schedule_t_p_s = args.t_p
    cfg.schedule_t_c_s = args.t_c
    os.makedirs(demo.workdir, exist_ok=True)
    v0 = version0(cfg, demo.workdir)
    print(f"version 0: {'cached' if v0.get('cached') else 'trained'} {v0['path']}")
    results = {"config": cfg.to_dict(), "schedules": {}}
    for name in schedules:
        cfg.schedule = name
        print(f"run ipp-{name}: viper, {cfg.duration_s:.0f} s ...", flush=True)
        records = run_one(f"sched-{name}", cfg, demo.workdir, demo.viper_path, transport="viper")
        summary = summarize(records["producer"], records["consumer"])
        policy = records["producer"]["policy"]
        results["schedules"][name] = {"summary": summary, "policy": policy}
    print()
    print(format_schedules(results["schedules"]))
    out = demo.json or os.path.join(demo.workdir, "schedules.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"results: {out}")
    return 0


def format_schedules(runs: dict) -> str:
    rows = [("schedule", "checkpoints", "iterations", "predicted CIL", "measured CIL", "requests", "mean req loss")]
    for name, r in runs.items():
        s, p = r["summary"], r["policy"]
        predicted = p.get("state", {}).get("predicted_cil", math.nan)
        rows.append((name, str(s["versions_published"]), str(s["iterations"]), f"{predicted:.2f}", f"{s['cil']:.2f}",
                     str(s["requests"]), f"{s['mean_loss']:.4f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append("")
    lines.append("predicted CIL of every policy on each run's own fit (IPP at the end of that run's warm-up):")
    for name, r in runs.items():
        plan = r["policy"].get("plan", {})
        by = plan.get("predicted_cil_by_policy", {})
        counts = plan.get("checkpoints_by_policy", {})
        cells = ", ".join(f"{k} {v:.2f} ({counts.get(k, '?')})" for k, v in by.items())
        lines.append(f"  run {name}: s={plan.get('warmup_end')} e={plan.get('end')} t_train={plan.get('t_train', 0):.3f}s "
                     f"t_p={plan.get('t_p', 0):.3f}s: {cells}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
