"""Tests of the continual-learning demo (examples/cl_demo) with the baseline file transport.

Run: /usr/bin/python3 -m pytest tests/python/test_demo_baseline.py
The end-to-end test starts real producer and consumer processes that train and serve a small model
(a few MiB) for a few seconds each, with real files; it takes about 20-30 s.
"""
import math
import os
import subprocess
import sys

import pytest
import torch

from demo_run import EXAMPLES, RUN_DEMO, run_small_demo  # tests/python is on sys.path

sys.path.insert(0, EXAMPLES)

from cl_demo.data import DriftingStream, StreamConfig, request_generator  # noqa: E402
from cl_demo.model import ModelConfig, NT3Like, state_bytes  # noqa: E402
from cl_demo.policy import IntervalPolicy  # noqa: E402
from cl_demo.results import summarize  # noqa: E402
from cl_demo.transports import FileTransport  # noqa: E402


# ---- drift generator -------------------------------------------------------------------------

def _gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def test_stream_is_deterministic_and_shaped():
    s = DriftingStream(StreamConfig(input_len=64, seed=5))
    x1, y1 = s.sample(16, 3.0, _gen(1))
    x2, y2 = s.sample(16, 3.0, _gen(1))
    assert x1.shape == (16, 1, 64) and x1.dtype == torch.float32
    assert y1.shape == (16,) and y1.dtype == torch.int64
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    # Another pattern seed gives other signals for the same latent draws.
    x3, _ = DriftingStream(StreamConfig(input_len=64, seed=6)).sample(16, 3.0, _gen(1))
    assert not torch.equal(x1, x3)


def test_boundary_rotates_with_time():
    period = 40.0
    s = DriftingStream(StreamConfig(input_len=32, period_s=period))
    _, y0 = s.sample(4000, 0.0, _gen(2))
    _, y_quarter = s.sample(4000, period / 4, _gen(2))  # same inputs, boundary turned 90 degrees
    _, y_half = s.sample(4000, period / 2, _gen(2))     # turned 180 degrees: every label flips
    _, y_full = s.sample(4000, period, _gen(2))         # a full turn: back to the start
    assert 0.4 < y0.float().mean() < 0.6
    assert torch.equal(y_half, 1 - y0)
    assert torch.equal(y_full, y0)
    disagreement = (y_quarter != y0).float().mean().item()
    assert 0.4 < disagreement < 0.6  # a 90-degree turn mislabels half the inputs
    _, y_small = s.sample(4000, period / 36, _gen(2))  # 10 degrees: ~10/180 of the inputs
    assert 0.02 < (y_small != y0).float().mean().item() < 0.1


def test_request_generators_are_independent_of_order():
    a = torch.randn(4, generator=request_generator(1, 7))
    b = torch.randn(4, generator=request_generator(1, 8))
    assert torch.equal(a, torch.randn(4, generator=request_generator(1, 7)))
    assert not torch.equal(a, b)


def test_stream_config_rejects_bad_values():
    for bad in (dict(input_len=4), dict(input_len=64, latent_dim=1), dict(input_len=64, period_s=0),
                dict(input_len=64, noise=-1)):
        with pytest.raises(ValueError, match="StreamConfig"):
            StreamConfig(**bad)
    with pytest.raises(ValueError, match="batch"):
        DriftingStream(StreamConfig(input_len=64)).sample(0, 0.0, _gen(0))


# ---- model size flag ---------------------------------------------------------------------------

@pytest.mark.parametrize("dense_mb", [1.0, 8.0, 24.0])
def test_model_size_follows_dense_mb(dense_mb):
    cfg = ModelConfig(dense_mb=dense_mb)
    model = NT3Like(cfg)
    dense = model.dense.weight.numel() * 4 / 2**20
    assert abs(dense - dense_mb) / dense_mb < 0.01
    total = state_bytes(model) / 2**20
    assert dense <= total < dense * 1.01 + 0.1  # the wide weight is nearly all of the bytes
    x = torch.randn(3, 1, cfg.input_len)
    assert model(x).shape == (3, 2)


def test_model_config_rejects_bad_size():
    with pytest.raises(ValueError, match="dense_mb"):
        ModelConfig(dense_mb=0)


def test_same_seed_same_weights():
    a, b = NT3Like(ModelConfig(dense_mb=1), seed=3), NT3Like(ModelConfig(dense_mb=1), seed=3)
    for (name, ta), tb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(ta, tb), name


# ---- publish policy ----------------------------------------------------------------------------

def test_interval_policy_iterations_and_seconds():
    now = [100.0]
    by_iter = IntervalPolicy(every_iters=3, clock=lambda: now[0])
    assert [i for i in range(1, 11) if by_iter.should_publish(i, 0.5)] == [3, 6, 9]
    by_time = IntervalPolicy(every_s=2.0, clock=lambda: now[0])
    fired = []
    for i in range(1, 11):
        now[0] += 0.7
        if by_time.should_publish(i, 0.5):
            fired.append(i)
    # The clock starts at the first call (100.7); due 2 s after it (i=4: 102.8), then 104.9, 107.0.
    assert fired == [4, 7, 10]
    # The seconds count from the end of the last publish: a 5 s publish does not make the next one due.
    slow = IntervalPolicy(every_s=2.0, clock=lambda: now[0])
    assert not slow.should_publish(1, 0.5)
    now[0] += 2.5
    assert slow.should_publish(2, 0.5)
    now[0] += 5.0  # the publish itself
    slow.on_published(2, 5.0)
    now[0] += 1.0
    assert not slow.should_publish(3, 0.5)
    now[0] += 1.0
    assert slow.should_publish(4, 0.5)
    with pytest.raises(ValueError):
        IntervalPolicy()


# ---- file transport ----------------------------------------------------------------------------

def test_file_transport_round_trip(tmp_path):
    cfg = ModelConfig(dense_mb=1)
    producer_side = FileTransport(str(tmp_path), poll_interval_s=0.05, keep_last=2)
    producer_side.start_producer()
    src = NT3Like(cfg, seed=1)
    for step in (10, 20, 30):
        with torch.no_grad():
            src.out.bias.fill_(float(step))
        stall = producer_side.publish(src.state_dict(), step, {"loss": 0.1, "publish_ns": 123})
        assert stall > 0
    # Retention keeps the newest two; a half-written file is never a candidate.
    (tmp_path / "model-000004.pt.tmp").write_bytes(b"torn")
    assert sorted(os.listdir(tmp_path)) == ["model-000002.pt", "model-000003.pt", "model-000004.pt.tmp"]

    consumer_side = FileTransport(str(tmp_path), poll_interval_s=0.05)
    consumer_side.start_consumer(deadline_ns=0)
    dst = NT3Like(cfg, seed=2)
    update = consumer_side.next_update(dst, current=0, timeout_s=1.0)
    assert update is not None and update.version == 3 and update.step == 30
    assert update.transport_timings["publish_ns"] == 123
    for (name, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert torch.equal(a, b), name
    assert consumer_side.next_update(dst, current=3, timeout_s=0.2) is None  # nothing newer


# ---- end to end --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_demo(tmp_path_factory):
    """Runs the demo once: reference (no publishing) then file transport, small and fast."""
    return run_small_demo(tmp_path_factory.mktemp("cl_demo"), "none,file")


def test_demo_prints_side_by_side_table(small_demo):
    _, stdout = small_demo
    assert "file + poll (today)" in stdout and "no publishing" in stdout
    for row in ("update latency mean (s)", "update latency p95 (s)", "versions that served requests",
                "training slowdown (stall)", "CIL (sum of request losses)", "publish: call -> complete",
                "fetch: -> bytes in consumer", "memcpy of the same bytes (s)", "copy speed / memcpy speed"):
        assert row in stdout


def test_demo_results_are_complete_and_sane(small_demo):
    results, _ = small_demo
    assert results["transports"] == ["none", "file"]
    file_run = results["runs"]["file"]
    s = results["summaries"]["file"]
    requests = file_run["consumer"]["requests"]
    assert len(requests) == s["requests"] == int(6 / 0.05)
    assert s["versions_published"] >= 3
    assert s["versions_served"] >= 2
    assert math.isfinite(s["cil"]) and s["cil"] > 0
    assert s["cil"] == pytest.approx(sum(r[6] for r in requests))
    versions = [r[4] for r in requests]
    assert versions == sorted(versions), "a request was served by an older version than a previous one"
    assert versions[0] == 0 and versions[-1] >= 2
    # Every loaded version has a latency from publish() to live, positive and bounded by the
    # publish, a poll interval and a load (generously, for a loaded machine).
    assert len(s["latencies_s"]) == s["versions_loaded"] >= 2
    assert all(0 < lat < 5.0 for lat in s["latencies_s"])
    assert s["latency_p95_s"] >= s["latency_mean_s"] > 0
    assert s["iterations"] > 0 and s["stall_total_s"] > 0
    # The producer kept publishing what the consumer loaded.
    steps = {p["step"] for p in file_run["producer"]["publishes"]}
    assert all(u["step"] in steps for u in file_run["consumer"]["updates"])
    # The latency's parts (publish, notify: the poll, fetch: torch.load, load: load_state_dict).
    parts = [s[f"{p}_mean_s"] for p in ("publish", "notify", "fetch", "load")]
    assert all(p >= 0 for p in parts) and sum(parts) == pytest.approx(s["latency_mean_s"])
    assert len(file_run["consumer"]["memcpy_s"]) == 6 and 0 < s["memcpy_s"] < 1.0


def test_updates_beat_a_stale_model(small_demo):
    """The drift makes version 0 worse over time and the updates repair it: over the same
    requests (identical samples in both runs), the updated consumer's loss is lower than the
    never-updated one's, most of all late in the run when version 0 is far off."""
    results, _ = small_demo
    stale = results["runs"]["none"]["consumer"]["requests"]
    fresh = results["runs"]["file"]["consumer"]["requests"]
    assert all(r[4] == 0 for r in stale)
    assert results["summaries"]["file"]["cil"] < 0.8 * results["summaries"]["none"]["cil"]
    late = [i for i, r in enumerate(fresh) if r[4] != 0 and i >= len(fresh) // 2]
    assert late, "no request in the second half was served by an updated version"
    stale_late = sum(stale[i][6] for i in late) / len(late)
    fresh_late = sum(fresh[i][6] for i in late) / len(late)
    assert fresh_late < 0.6 * stale_late
    # The stale model's own loss grows with the drift.
    half = len(stale) // 2
    assert sum(r[6] for r in stale[half:]) > 1.5 * sum(r[6] for r in stale[:half])


def test_summarize_joins_latencies_by_step():
    producer = {"publishes": [{"step": 5, "publish_ns": 1_000_000_000}, {"step": 9, "publish_ns": 3_000_000_000}],
                "iterations": 10, "loop_s": 4.0, "stall_s": 1.0, "state_bytes": 2**20,
                "steps": [[10, 3.9, 0.2, 0.3]]}
    consumer = {"updates": [{"step": 9, "live_ns": 3_500_000_000, "version": 2}],
                "requests": [[0, 0, 0, 1, 0, 0, 0.7, 0.5], [1, 0, 0, 1, 2, 9, 0.3, 1.0]]}
    reference = {"s_per_iteration": 0.3, "cil": 2.0}
    s = summarize(producer, consumer, reference)
    assert s["latencies_s"] == [pytest.approx(0.5)]
    assert s["versions_served"] == 1 and s["versions_loaded"] == 1 and s["versions_published"] == 2
    assert s["cil"] == pytest.approx(1.0) and s["cil_vs_reference"] == pytest.approx(0.5)
    assert s["slowdown_from_stall"] == pytest.approx(1.0 / 3.0)
    assert s["slowdown_vs_reference"] == pytest.approx(0.4 / 0.3 - 1.0)


def test_summarize_splits_the_latency_and_compares_the_copy_with_memcpy():
    ms = 1_000_000
    producer = {"publishes": [{"step": 4, "publish_ns": 1000 * ms}], "iterations": 4, "loop_s": 1.0, "stall_s": 0.1,
                "state_bytes": 2**20, "steps": [[4, 0.9, 0.2, 0.2]]}
    timings = {"completed_ns": 1030 * ms, "notified_ns": 1031 * ms, "live_ns": 1032 * ms}
    consumer = {"updates": [{"step": 4, "version": 1, "transport_timings": timings, "detected_ns": 1035 * ms,
                             "loaded_ns": 1075 * ms, "live_ns": 1076 * ms}],
                "requests": [[0, 0, 0, 1, 1, 4, 0.5, 1.0]], "memcpy_s": [0.05, 0.03, 0.04]}
    s = summarize(producer, consumer)
    assert s["publish_mean_s"] == pytest.approx(0.030) and s["notify_mean_s"] == pytest.approx(0.001)
    assert s["fetch_mean_s"] == pytest.approx(0.001) and s["load_mean_s"] == pytest.approx(0.044)
    assert sum(s[f"{p}_mean_s"] for p in ("publish", "notify", "fetch", "load")) == pytest.approx(s["latency_mean_s"])
    assert s["copy_into_model_mean_s"] == pytest.approx(0.040)  # load_into: detected -> loaded
    assert s["memcpy_s"] == pytest.approx(0.03) and s["copy_vs_memcpy"] == pytest.approx(0.75)


def test_bad_settings_fail_with_a_clear_message(tmp_path):
    for args, expected in ((["--model-mb", "-1"], "dense_mb must be > 0"),
                           (["--transports", "file,ftp"], "unknown ['ftp']"),
                           (["--duration", "0"], "duration_s")):
        proc = subprocess.run([sys.executable, RUN_DEMO, "--workdir", str(tmp_path)] + args,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0
        assert expected in proc.stderr, proc.stderr
