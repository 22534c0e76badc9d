"""The continual-learning demo with the Viper transport (examples/cl_demo, ViperTransport).

This is the demo's contract test of the `viper` Python bindings: it runs only where `import viper`
works (build the bindings and put them on PYTHONPATH); elsewhere pytest reports it as skipped,
with the import error as the reason. Run: /usr/bin/python3 -m pytest tests/python/test_demo_viper.py
"""
import math
import sys

import pytest

from demo_run import EXAMPLES, run_small_demo  # tests/python is on sys.path

sys.path.insert(0, EXAMPLES)

from cl_demo.transports import viper_import_error  # noqa: E402

VIPER_ERROR = viper_import_error()
pytestmark = pytest.mark.skipif(VIPER_ERROR is not None, reason=f"import viper failed: {VIPER_ERROR}")


@pytest.fixture(scope="module")
def viper_demo(tmp_path_factory):
    return run_small_demo(tmp_path_factory.mktemp("cl_demo_viper"), "file,viper", "--require-viper")


def test_viper_run_is_complete_and_sane(viper_demo):
    results, stdout = viper_demo
    assert "viper (memory, push)" in stdout
    assert results["viper"]["available"] is True
    s = results["summaries"]["viper"]
    run = results["runs"]["viper"]
    assert s["versions_published"] >= 3 and s["versions_served"] >= 2
    assert math.isfinite(s["cil"]) and s["cil"] > 0
    versions = [r[4] for r in run["consumer"]["requests"]]
    assert versions == sorted(versions) and versions[0] == 0
    assert len(s["latencies_s"]) == s["versions_loaded"] >= 2
    assert all(0 < lat < 5.0 for lat in s["latencies_s"])
    steps = {p["step"] for p in run["producer"]["publishes"]}
    for u in run["consumer"]["updates"]:
        assert u["step"] in steps
        timings = u["transport_timings"]
        assert "completed_ns" in timings and "live_ns" in timings
        publish_ns = next(p["publish_ns"] for p in run["producer"]["publishes"] if p["step"] == u["step"])
        assert publish_ns <= timings["completed_ns"] <= timings["live_ns"] <= u["live_ns"]
    # The latency's parts: publish, notify, fetch (subscriber live), load (load_into, swap).
    parts = [s[f"{p}_mean_s"] for p in ("publish", "notify", "fetch", "load")]
    assert all(p >= 0 for p in parts) and sum(parts) == pytest.approx(s["latency_mean_s"])
    assert 0 < s["copy_into_model_mean_s"] <= s["load_mean_s"] and 0 < s["memcpy_s"] < 1.0
    assert "copy speed / memcpy speed" in stdout
