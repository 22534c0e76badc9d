"""The continual-learning demo with the Viper transport (examples/cl_demo, ViperTransport).

This is the demo's contract test of the `viper` Python bindings: it runs only where `import viper`
works (build the bindings and put them on PYTHONPATH); elsewhere pytest reports it as skipped,
with the import error as the reason. Run: /usr/bin/python3 -m pytest tests/python/test_demo_viper.py
"""
import json
import math
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
sys.path.insert(0, EXAMPLES)

from cl_demo.transports import viper_import_error  # noqa: E402

VIPER_ERROR = viper_import_error()
pytestmark = pytest.mark.skipif(VIPER_ERROR is not None, reason=f"import viper failed: {VIPER_ERROR}")


@pytest.fixture(scope="module")
def viper_demo(tmp_path_factory):
    work = tmp_path_factory.mktemp("cl_demo_viper")
    out = work / "results.json"
    cmd = [sys.executable, os.path.join(EXAMPLES, "cl_demo", "run_demo.py"), "--model-mb", "2",
           "--duration", "6", "--period", "16", "--transports", "file,viper", "--require-viper",
           "--publish-every-s", "0.5", "--poll-interval", "0.5", "--request-interval", "0.05",
           "--pretrain-iters", "40", "--workdir", str(work), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"run_demo failed\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    with open(out, encoding="utf-8") as f:
        return json.load(f), proc.stdout


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
