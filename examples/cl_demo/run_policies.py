#!/usr/bin/python3
"""The policies stage: the same training under three checkpoint policies, side by side.

    /usr/bin/python3 examples/cl_demo/run_policies.py [--duration 30] [--warmup-iters 60] [--plot out.png]

A producer trains an NT3-like model (25 MiB) from scratch on a stationary 8-class stream, so its
loss falls with the iterations (the Inference Performance Predictor's world: a model that gets
better while consumers use it); a consumer serves 150 requests per run. Steps:

1. warm-up: one real run (producer + consumer over Viper) trains `--warmup-iters` iterations and
   publishes every 10 of them; it gives the warm-up losses, the clean time per iteration t_train,
   the whole cost of a publish t_p (its stall and the slower steps after it while the version is
   sealed, stored and loaded on the same CPUs), the update latency t_c (publish returned ->
   version served by the consumer), and the warm-up model every policy run starts from;
2. prediction, before any policy runs: a viper.Scheduler (policy "optimal") is made from those
   measurements (the warm-up losses as its history): its plan and predicted CIL, and its predicted
   CIL of the two other policies' schedules (Scheduler.evaluate);
3. three runs from the warm-up model (each as long as `--run-iters` iterations take at the
   warm-up's pace, 10-60 s), identical but for when they publish:
   epoch (every `--epoch-iters` iterations, default a quarter of the run), fixed interval (every
   `--interval-s` seconds of training, what the transports stage does), and the IPP online (that
   scheduler, handed to viper.Publisher: it measures t_train and the whole cost of a publish on
   the wall clock, gets every publish's stall and t_c from the consumer's ACKs, refits and
   re-plans as the run goes);
4. the table (predicted and measured CIL per policy, and the model's CIL in hindsight: the run's
   own checkpoints, timings and loss curve), and a plot of served loss over time per policy with
   its publish points.

Results: <workdir>/policies.json, plot: <workdir>/policies.png (or --plot).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # examples/, for `import cl_demo`

from cl_demo.config import DemoConfig  # noqa: E402
from cl_demo.results import summarize  # noqa: E402
from cl_demo.runtime import write_json  # noqa: E402

POLICIES = ("epoch", "interval", "ipp")
LABELS = {"epoch": "epoch", "interval": "fixed interval", "ipp": "IPP online"}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=0.0,
                    help="seconds per policy run (0 = auto: --run-iters at the warm-up's time per iteration, "
                         "10-60 s) [%(default)s]")
    ap.add_argument("--run-iters", type=int, default=200,
                    help="iterations a policy run can make (sets the auto duration) [%(default)s]")
    ap.add_argument("--warmup-iters", type=int, default=60, help="s: iterations of the shared warm-up [%(default)s]")
    ap.add_argument("--epoch-iters", type=int, default=0,
                    help="epoch policy: iterations per epoch (0 = a quarter of the iterations the run can make)")
    ap.add_argument("--interval-s", type=float, default=2.0, help="fixed-interval policy: seconds [%(default)s]")
    ap.add_argument("--ipp-policy", default="optimal", help="the IPP's scheduler [%(default)s]")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated, from %(default)s")
    ap.add_argument("--model-mb", type=float, default=25.0, help="MiB of the wide dense weight [%(default)s]")
    ap.add_argument("--classes", type=int, default=8, help="sectors of the task [%(default)s]")
    ap.add_argument("--lr", type=float, default=0.05, help="[%(default)s]")
    ap.add_argument("--train-batch", type=int, default=16, help="[%(default)s]")
    ap.add_argument("--requests", type=int, default=150, help="requests per run (sets the auto interval) [%(default)s]")
    ap.add_argument("--request-interval", type=float, default=0.0,
                    help="seconds between requests (0 = auto: duration / --requests, at least 0.05) [%(default)s]")
    ap.add_argument("--request-batch", type=int, default=32, help="samples per request [%(default)s]")
    ap.add_argument("--workdir", default="/tmp/viper-cl-demo", help="[%(default)s]")
    ap.add_argument("--json", default=None, help="results file [WORKDIR/policies.json]")
    ap.add_argument("--plot", default=None, help="plot file (.png or .svg) [WORKDIR/policies.png]")
    ap.add_argument("--viper-path", default=None, help="directory to add to PYTHONPATH for `import viper`")
    args = ap.parse_args(argv)
    args.policies = [p for p in args.policies.split(",") if p]
    bad = [p for p in args.policies if p not in POLICIES]
    if bad or not args.policies:
        ap.error(f"--policies: unknown {bad}; choose from {','.join(POLICIES)}")
    if args.warmup_iters < 10:
        ap.error("--warmup-iters must be >= 10")
    return args


def stage_config(args) -> DemoConfig:
    return DemoConfig(dense_mb=args.model_mb, classes=args.classes, period_s=math.inf, lr=args.lr,
                      train_batch=args.train_batch, pretrain_iters=0, duration_s=args.duration or 30.0,
                      request_interval_s=args.request_interval or 0.2, request_batch=args.request_batch,
                      publish_every_s=None, publish_every_iters=None)


def size_runs(cfg: DemoConfig, args, t_train: float) -> None:
    """The policy runs are sized in iterations and requests, so that the training (a curve over
    iterations) and the IPP's extrapolation from the warm-up (run / warm-up = 200 / 60) are the
    same on a quiet or a loaded machine; their wall time follows from the measured t_train. A run
    lasts at least 10 s (150 requests at least 0.05 s apart need 7.5 s), so where an iteration takes
    under 0.05 s the runs make more than --run-iters and the IPP extrapolates further."""
    if not args.duration:
        cfg.duration_s = round(min(60.0, max(10.0, args.run_iters * t_train)), 1)
    if not args.request_interval:
        cfg.request_interval_s = round(max(0.05, cfg.duration_s / args.requests), 3)


# ---- measurements --------------------------------------------------------------------------------

def timings(producer: dict, consumer: dict, cost_intervals: int = 3, skip: int = 5) -> dict:
    """What viper.Scheduler measures, from a run's records (its rules, docs/ARCHITECTURE.md):
    t_train: mean seconds per iteration on the intervals at least `cost_intervals` after a publish
    (without pauses over 5x their median), leaving out the first `skip` (cold caches);
    t_p: what one publish costs the training in all: the larger of the mean stall and the mean
    excess over t_train of the `cost_intervals` intervals starting with the publish's (its stall,
    then the slower steps while the version is sealed, written and loaded beside the training);
    t_p_stall: the mean stall; t_c: median of publish returned -> version served by the consumer.
    The first publish of a model (it makes its segments) is left out of both costs."""
    steps = producer["steps"]
    published = [p["step"] for p in producer["publishes"]]
    first = published[0] if published else None
    since, last, by_distance, clean = -1, None, {}, []
    for i, (a, b) in enumerate(zip(steps, steps[1:])):
        if a[0] in published:
            since, last = 0, a[0]
        elif since >= 0:
            since += 1
        if i < skip:
            continue
        gap = b[1] - a[1]
        if since < 0 or since >= cost_intervals:
            clean.append(gap)
        elif last != first:
            by_distance.setdefault(since, []).append(gap)
    if clean:
        limit = 5 * statistics.median(clean)
        clean = [g for g in clean if g <= limit]
    t_train = statistics.fmean(clean) if clean else math.nan
    stalls = [p["stall_s"] for p in producer["publishes"]][1:]
    t_p_stall = statistics.fmean(stalls) if stalls else math.nan
    whole = math.nan
    if clean and all(len(by_distance.get(d, [])) >= 2 for d in range(cost_intervals)):
        whole = sum(statistics.fmean(by_distance[d]) - t_train for d in range(cost_intervals))
    returned = {p["step"]: p["returned_ns"] for p in producer["publishes"]}
    latencies = [(u["live_ns"] - returned[u["step"]]) / 1e9 for u in consumer["updates"] if u["step"] in returned]
    t_p = max(x for x in (t_p_stall, whole, 0.0) if not math.isnan(x))
    return {"t_train": t_train, "t_p": t_p if stalls else math.nan, "t_p_stall": t_p_stall,
            "t_c": statistics.median(latencies) if latencies else math.nan}


def warmup(cfg: DemoConfig, args, workdir: str) -> dict:
    """The shared warm-up run; returns its measurements and the path of the warm-up model."""
    from cl_demo.run_demo import run_one  # noqa: PLC0415 (imports torch)
    s = args.warmup_iters
    w = DemoConfig(**cfg.to_dict())
    w.max_iterations = s
    w.publish_every_iters = 10
    w.duration_s = 600.0  # bounded by max_iterations; the consumer stops with the producer
    w.save_final_path = os.path.join(workdir, "warmup-model.pt")
    records = run_one("policies-warmup", w, workdir, args.viper_path, transport="viper",
                      stop_consumer_with_producer=True)
    producer, consumer = records["producer"], records["consumer"]
    return {"model": w.save_final_path, "iterations": s,
            "losses": [(int(st[0]), float(st[2])) for st in producer["steps"]],
            **timings(producer, consumer), "publishes": len(producer["publishes"]),
            "wall_s": producer["loop_s"]}


# ---- the IPP's prediction before the runs --------------------------------------------------------

def every(start: int, gap: int, end: int) -> list:
    return list(range(start + gap, end + 1, gap))


def plan(cfg: DemoConfig, args, w: dict) -> dict:
    """The IPP's setup and predictions, from the warm-up alone."""
    import viper  # noqa: PLC0415
    from cl_demo.policy import make_scheduler  # noqa: PLC0415
    s = w["iterations"]
    end = s + math.ceil(cfg.duration_s / w["t_train"])  # iterations the run can reach without stalls
    requests = int(round(cfg.duration_s / cfg.request_interval_s))
    setup = {"policy": args.ipp_policy, "warmup_end": s, "end": end, "t_infer": cfg.request_interval_s,
             "requests": requests, "t_train": w["t_train"], "t_p": w["t_p"], "t_c": w["t_c"],
             "history": w["losses"], "checkpoint_at_warmup_end": False, "duration": cfg.duration_s}
    epoch = args.epoch_iters or max(1, (end - s) // 4)
    interval_iters = max(1, math.ceil(args.interval_s / w["t_train"]))
    schedules = {"epoch": every(s, epoch, end), "interval": every(s, interval_iters, end)}
    sched = make_scheduler(viper, setup)
    state = sched.state()
    if state["plans"] < 1:
        raise RuntimeError(f"the IPP could not plan from the warm-up: {state['last_plan_status']}")
    schedules["ipp"] = list(state["planned"])
    predicted = {name: sched.evaluate(x) for name, x in schedules.items()}
    predicted["ipp"] = state["predicted_cil"]
    return {"setup": setup, "epoch_iters": epoch, "interval_iters": interval_iters, "schedules": schedules,
            "predicted": predicted, "fit": state["fit"], "plan_source": state["plan_source"]}


# ---- the model in hindsight ----------------------------------------------------------------------

def smoothed_losses(producer: dict, history, window: int = 9) -> dict:
    """iteration -> training loss smoothed over `window` steps, warm-up history included."""
    pts = list(history) + [(int(st[0]), float(st[2])) for st in producer["steps"]]
    half, out = window // 2, {}
    for i, (x, _) in enumerate(pts):
        h = min(half, i, len(pts) - 1 - i)
        out[x] = statistics.fmean(v for _, v in pts[i - h:i + h + 1])
    return out


def model_cil(schedule, s: int, t_train: float, t_p: float, t_c: float, t_infer: float, requests: int, loss) -> float:
    """The IPP's CIL model (docs/ARCHITECTURE.md): version k live at (x_k - s)*t_train + k*t_p + t_c."""
    live = [0.0] + [(x - s) * t_train + (k + 1) * t_p + t_c for k, x in enumerate(schedule)]
    xs = [s] + list(schedule)
    n = [min(requests, max(0, math.ceil(t / t_infer - 1e-9))) for t in live] + [requests]
    return sum(loss(xs[k]) * (n[k + 1] - n[k]) for k in range(len(xs)))


def hindsight(run: dict, plan_: dict, w: dict, cfg: DemoConfig) -> dict:
    """The CIL model with this run's own checkpoints, timings and (smoothed) loss curve: how much of
    the prediction error is the model rather than the loss curve extrapolated from the warm-up."""
    producer, consumer = run["producer"], run["consumer"]
    s = w["iterations"]
    losses = smoothed_losses(producer, w["losses"])
    last = max(losses)
    # The checkpoint after iteration x has had x steps; its loss is the one logged at x + 1.
    def loss(x):
        return losses[min(x + 1, last)]
    costs = timings(producer, consumer)
    t_p = costs["t_p"] if not math.isnan(costs["t_p"]) else w["t_p"]
    t_c = costs["t_c"] if not math.isnan(costs["t_c"]) else w["t_c"]
    t_train = costs["t_train"] if not math.isnan(costs["t_train"]) else w["t_train"]
    schedule = [p["step"] for p in producer["publishes"]]
    return {"cil": model_cil(schedule, s, t_train, t_p, t_c, cfg.request_interval_s,
                             plan_["setup"]["requests"], loss),
            "t_train": t_train, "t_p": t_p, "t_c": t_c}


# ---- output --------------------------------------------------------------------------------------

def format_table(rows: dict, plan_: dict) -> str:
    head = ("policy", "checkpoints", "iterations", "late req.", "predicted CIL", "measured CIL", "pred. error",
            "model, hindsight", "vs epoch")
    lines = [head]
    epoch = rows.get("epoch", {}).get("measured")
    for name, r in rows.items():
        vs = f"{r['measured'] / epoch - 1:+.1%}" if epoch and name != "epoch" else "-"
        lines.append((r["label"], str(r["checkpoints"]), str(r["iterations"]), str(r["summary"]["late_requests"]),
                      f"{r['predicted']:.2f}",
                      f"{r['measured']:.2f}", f"{r['predicted'] / r['measured'] - 1:+.1%}",
                      f"{r['hindsight']['cil']:.2f}", vs))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(c.rjust(wd) if i else c.ljust(wd) for i, (c, wd) in enumerate(zip(line, widths)))
            for line in lines]
    text.insert(1, "-" * len(text[0]))
    return "\n".join(text)


def targets(rows: dict) -> list:
    out = []
    if "ipp" in rows and "epoch" in rows:
        gain = 1 - rows["ipp"]["measured"] / rows["epoch"]["measured"]
        out.append(("IPP measured CIL below epoch", f"{gain:.1%}", ">= 10%", gain >= 0.10))
    if "ipp" in rows:
        err = abs(rows["ipp"]["predicted"] / rows["ipp"]["measured"] - 1)
        out.append(("IPP predicted CIL vs measured", f"{err:.1%} off", "within 5%", err <= 0.05))
    return out


def plot(runs: dict, rows: dict, path: str, title: str) -> None:
    """Served loss over time per policy (mean over 1 s of requests) with the moments its versions
    went live at the consumer marked."""
    import matplotlib  # noqa: PLC0415 (python3-matplotlib, Debian)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    fig, ax = plt.subplots(figsize=(9, 4.6))
    for (name, run), color in zip(runs.items(), ("tab:gray", "tab:blue", "tab:red")):
        reqs, start = run["consumer"]["requests"], run["consumer"]["start_ns"]
        t = [(r[1] - start) / 1e9 for r in reqs]
        loss = [r[6] for r in reqs]
        k = max(1, int(round(1.0 / (t[1] - t[0])))) if len(t) > 1 else 1
        smooth = [statistics.fmean(loss[max(0, i - k + 1):i + 1]) for i in range(len(loss))]
        label = f"{rows[name]['label']}: CIL {rows[name]['measured']:.1f}, {rows[name]['checkpoints']} versions"
        ax.plot(t, smooth, color=color, lw=1.6, label=label)
        live = [(u["live_ns"] - start) / 1e9 for u in run["consumer"]["updates"]]
        ys = [smooth[min(len(smooth) - 1, max(0, next((i for i, x in enumerate(t) if x >= lt), len(t) - 1)))]
              for lt in live]
        ax.plot(live, ys, linestyle="none", marker="v", ms=5, color=color, alpha=0.8)
    ax.set_xlabel("seconds since the run started (markers: a new version went live at the consumer)")
    ax.set_ylabel("served loss (mean cross-entropy, 1 s window)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    t_start = time.perf_counter()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.viper_path:
        sys.path.insert(0, args.viper_path)
    from cl_demo.transports import viper_import_error  # noqa: PLC0415
    err = viper_import_error()
    if err is not None:
        print(f"run_policies: the IPP needs the viper bindings: {err}", file=sys.stderr)
        return 2
    from cl_demo.run_demo import run_one, version0  # noqa: PLC0415 (imports torch)
    os.makedirs(args.workdir, exist_ok=True)
    cfg = stage_config(args)
    v0 = version0(cfg, args.workdir)
    print(f"policies: version 0 {'reused' if v0.get('cached') else 'made'} ({cfg.dense_mb:.0f} MiB model, "
          f"{cfg.classes} classes, untrained)", flush=True)
    print(f"policies: warm-up, {args.warmup_iters} iterations over viper (publishing every 10) ...", flush=True)
    w = warmup(cfg, args, args.workdir)
    print(f"policies: warm-up measured t_train {w['t_train']:.3f} s, t_p {w['t_p']:.3f} s (whole cost of a publish; "
          f"its stall {w['t_p_stall']:.3f} s), t_c {w['t_c']:.3f} s ({w['publishes']} publishes)", flush=True)
    size_runs(cfg, args, w["t_train"])
    print(f"policies: runs of {cfg.duration_s:g} s (about {cfg.duration_s / w['t_train']:.0f} iterations at the "
          f"warm-up's t_train; --run-iters {args.run_iters}, 10-60 s), "
          f"one request every {cfg.request_interval_s:g} s", flush=True)
    p = plan(cfg, args, w)
    print(f"policies: IPP ({args.ipp_policy}) before the runs: fit {p['fit']['formula'] if p['fit'] else '-'} "
          f"({p['plan_source']}); {len(p['schedules']['ipp'])} checkpoints planned, predicted CIL "
          f"{p['predicted']['ipp']:.2f} (epoch {p['predicted']['epoch']:.2f}, "
          f"interval {p['predicted']['interval']:.2f})", flush=True)
    ipp_path = os.path.join(args.workdir, "ipp.json")
    write_json(ipp_path, p["setup"])

    runs, rows = {}, {}
    for name in args.policies:
        r = DemoConfig(**cfg.to_dict())
        r.init_path, r.start_iteration = w["model"], w["iterations"]
        if name == "epoch":
            r.publish_every_iters = p["epoch_iters"]
        elif name == "interval":
            r.publish_every_s = args.interval_s
        else:
            r.ipp_path = ipp_path
        print(f"run {LABELS[name]}: viper, {r.duration_s:.0f} s ...", flush=True)
        runs[name] = run_one(f"policy-{name}", r, args.workdir, args.viper_path, transport="viper")
        summary = summarize(runs[name]["producer"], runs[name]["consumer"])
        rows[name] = {"label": LABELS[name], "checkpoints": summary["versions_published"],
                      "iterations": summary["iterations"], "predicted": p["predicted"][name],
                      "measured": summary["cil"], "hindsight": hindsight(runs[name], p, w, cfg),
                      "summary": summary}
    if "epoch" in rows:
        rows["epoch"]["label"] += f" (every {p['epoch_iters']} it)"
    if "interval" in rows:
        rows["interval"]["label"] += f" (every {args.interval_s:g} s)"
    if "ipp" in rows:
        rows["ipp"]["label"] += f" ({args.ipp_policy})"

    print()
    print(format_table(rows, p))
    met = targets(rows)
    for what, value, target, ok in met:
        print(f"  [{'MET' if ok else 'NOT MET'}] {what}: {value} (target {target})")
    plot_path = args.plot or os.path.join(args.workdir, "policies.png")
    title = (f"{cfg.dense_mb:.0f} MiB model, {cfg.classes}-class stream, {cfg.duration_s:.0f} s per policy after a "
             f"{w['iterations']}-iteration warm-up; one request every {cfg.request_interval_s:g} s")
    plot(runs, rows, plot_path, title)
    total = time.perf_counter() - t_start
    print(f"plot: {plot_path}\nwall time: {total:.1f} s")
    out = args.json or os.path.join(args.workdir, "policies.json")
    ipp_state = runs.get("ipp", {}).get("producer", {}).get("policy", {})
    write_json(out, {"config": cfg.to_dict(), "warmup": {k: v for k, v in w.items()}, "plan": p,
                     "rows": rows, "targets": [dict(zip(("what", "value", "target", "met"), t)) for t in met],
                     "ipp": ipp_state, "runs": runs, "wall_s": total,
                     "host": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()}})
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
