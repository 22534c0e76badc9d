"""Turns one run's producer and consumer records into the figures the demo compares."""
from __future__ import annotations

import math
from typing import Optional

from cl_demo.runtime import percentile

LABELS = {"none": "no publishing", "file": "file + poll (today)", "viper": "viper (memory, push)"}


def summarize(producer: dict, consumer: dict, reference: Optional[dict] = None) -> dict:
    """Figures of one run. `reference` is the summary of the no-publishing run, if there was one."""
    publishes = producer["publishes"]
    published_at = {p["step"]: p["publish_ns"] for p in publishes}
    updates = consumer["updates"]
    latencies = [(u["live_ns"] - published_at[u["step"]]) / 1e9 for u in updates if u["step"] in published_at]
    requests = consumer["requests"]
    losses = [r[6] for r in requests]
    served = sorted({r[4] for r in requests})
    iterations = producer["iterations"]
    loop_s = producer["loop_s"]
    stall_s = producer["stall_s"]
    s_per_iter = loop_s / iterations if iterations else math.nan
    out = {
        "state_mb": producer["state_bytes"] / 2**20,
        "versions_published": len(publishes),
        "versions_loaded": len(updates),
        "versions_served": len([v for v in served if v != 0]),
        "latency_mean_s": _mean(latencies),
        "latency_p95_s": percentile(latencies, 95),
        "latency_max_s": max(latencies) if latencies else math.nan,
        "latencies_s": latencies,
        "stall_total_s": stall_s,
        "stall_mean_s": stall_s / len(publishes) if publishes else 0.0,
        "iterations": iterations,
        "loop_s": loop_s,
        "s_per_iteration": s_per_iter,
        # How much longer the same training takes because of publishing, two ways: from the stall
        # the loop measured, and against the measured loop of the run without publishing.
        "slowdown_from_stall": stall_s / (loop_s - stall_s) if loop_s > stall_s else math.nan,
        "slowdown_vs_reference": (s_per_iter / reference["s_per_iteration"] - 1.0) if reference else None,
        "requests": len(requests),
        "cil": sum(losses),
        "mean_loss": _mean(losses),
        "accuracy": _mean([r[7] for r in requests]),
        # A request is late when the consumer began it more than 50 ms after it was due (the
        # serving core was busy): late requests are still served, by the version live then.
        "late_requests": sum(1 for r in requests if r[2] - r[1] > 50_000_000),
        "max_lag_s": max(((r[2] - r[1]) / 1e9 for r in requests), default=math.nan),
        "final_train_loss": producer["steps"][-1][2] if producer["steps"] else math.nan,
    }
    out.update(latency_split(updates, published_at, consumer.get("memcpy_s") or []))
    if reference:
        out["cil_vs_reference"] = out["cil"] / reference["cil"] if reference["cil"] else math.nan
    return out


# The milestones an update passes, in order, and the name of the part that ends at each: from
# publish called (the producer's clock) to complete (all bytes in the transport: Viper's node
# announced it / the file was written), notified (the consumer learned of it: NOTIFY / its poll
# found the file), fetched (the bytes are in the consumer: mapped and live in the subscriber /
# torch.load done) and live (loaded into the spare model and swapped in: load_into /
# load_state_dict). The four parts add up to the update latency.
SPLIT = (("publish", "completed_ns"), ("notify", "notified_ns"), ("fetch", "live_ns"), ("load", None))


def latency_split(updates: list, published_at: dict, memcpy_s: list) -> dict:
    """Mean seconds of each part of SPLIT over the updates whose transport reported the
    milestones; the mean copy into the model (load_into / load_state_dict) against the warmest of
    the consumer's memcpy's of the same bytes (`memcpy_s`, measured before and after the run)."""
    parts = {name: [] for name, _ in SPLIT}
    copies = []
    for u in updates:
        t = u.get("transport_timings") or {}
        marks = [published_at.get(u["step"])] + [t.get(key) for _, key in SPLIT[:-1]] + [u["live_ns"]]
        if any(m is None for m in marks):
            continue
        for (name, _), begin, end in zip(SPLIT, marks, marks[1:]):
            parts[name].append((end - begin) / 1e9)
        copies.append((u["loaded_ns"] - max(u["detected_ns"], t["live_ns"])) / 1e9)
    out = {f"{name}_mean_s": _mean(xs) for name, xs in parts.items()}
    out["copy_into_model_mean_s"] = _mean(copies)
    out["memcpy_s"] = min(memcpy_s) if memcpy_s else math.nan
    out["copy_vs_memcpy"] = out["memcpy_s"] / out["copy_into_model_mean_s"] if copies and memcpy_s else math.nan
    return out


def format_table(summaries: dict) -> str:
    """A side-by-side text table: one column per run, in the order of `summaries`."""
    names = list(summaries)
    rows = [
        ("model state (MiB)", "state_mb", "{:.0f}"),
        ("versions published", "versions_published", "{}"),
        ("versions loaded by consumer", "versions_loaded", "{}"),
        ("versions that served requests", "versions_served", "{}"),
        ("update latency mean (s)", "latency_mean_s", "{:.3f}"),
        ("update latency p95 (s)", "latency_p95_s", "{:.3f}"),
        ("  publish: call -> complete (s)", "publish_mean_s", "{:.3f}"),
        ("  notify: -> consumer told (s)", "notify_mean_s", "{:.3f}"),
        ("  fetch: -> bytes in consumer (s)", "fetch_mean_s", "{:.3f}"),
        ("  load: -> live in the model (s)", "load_mean_s", "{:.3f}"),
        ("copy into the model, mean (s)", "copy_into_model_mean_s", "{:.3f}"),
        ("memcpy of the same bytes (s)", "memcpy_s", "{:.3f}"),
        ("  copy speed / memcpy speed", "copy_vs_memcpy", "{:.2f}x"),
        ("publish stall mean (s)", "stall_mean_s", "{:.3f}"),
        ("producer stall total (s)", "stall_total_s", "{:.2f}"),
        ("training iterations", "iterations", "{}"),
        ("time per iteration (s)", "s_per_iteration", "{:.3f}"),
        ("training slowdown (stall)", "slowdown_from_stall", "{:+.1%}"),
        ("training slowdown (vs no publish)", "slowdown_vs_reference", "{:+.1%}"),
        ("requests served", "requests", "{}"),
        ("  of which late (> 50 ms)", "late_requests", "{}"),
        ("CIL (sum of request losses)", "cil", "{:.2f}"),
        ("mean request loss", "mean_loss", "{:.4f}"),
        ("request accuracy", "accuracy", "{:.3f}"),
        ("CIL / CIL without updates", "cil_vs_reference", "{:.3f}"),
    ]
    width = max(len(r[0]) for r in rows) + 2
    col = max([22] + [len(LABELS.get(n, n)) + 2 for n in names])
    lines = [" " * width + "".join(LABELS.get(n, n).rjust(col) for n in names)]
    for label, key, fmt in rows:
        cells = []
        for n in names:
            value = summaries[n].get(key)
            if n == "none" and key.startswith(("latency", "slowdown_vs", "cil_vs")):
                value = None
            cells.append(_cell(value, fmt).rjust(col))
        lines.append(label.ljust(width) + "".join(cells))
    return "\n".join(lines)


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def _mean(xs) -> float:
    return sum(xs) / len(xs) if xs else math.nan
