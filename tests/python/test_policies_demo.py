"""examples/cl_demo/run_policies.py: the policies stage (epoch vs the IPP online) with real producer
and consumer processes over Viper, small model, short runs; and the stage driver (demo.py)."""
import json
import math
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
sys.path.insert(0, EXAMPLES)

from cl_demo.run_policies import model_cil  # noqa: E402


def test_model_cil_is_the_design_formula():
    # L(s) = 2 until version 1 (after iteration 12) is live at (12 - 10)*1 + 1*0.5 + 0.25 = 2.75 s:
    # requests at 0, 1, 2 get 2.0, the rest (7 of 10) 1.0.
    loss = {10: 2.0, 12: 1.0}
    assert model_cil([12], 10, 1.0, 0.5, 0.25, 1.0, 10, loss.__getitem__) == pytest.approx(3 * 2.0 + 7 * 1.0)
    assert model_cil([], 10, 1.0, 0.5, 0.25, 1.0, 10, loss.__getitem__) == pytest.approx(20.0)


def test_policies_stage_predicts_before_and_measures_each_run(tmp_path):
    out, plot = tmp_path / "policies.json", tmp_path / "policies.svg"
    cmd = [sys.executable, os.path.join(EXAMPLES, "cl_demo", "demo.py"), "--stages", "policies",
           "--workdir", str(tmp_path), "--policies-args",
           f"--policies epoch,ipp --model-mb 2 --duration 5 --request-interval 0.2 --warmup-iters 20 "
           f"--plot {plot} --json {out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "predicted CIL" in proc.stdout and "measured CIL" in proc.stdout and "=== stage policies" in proc.stdout
    results = json.loads(out.read_text())
    assert set(results["rows"]) == {"epoch", "ipp"}
    w = results["warmup"]
    assert len(w["losses"]) == 20 and w["t_train"] > 0 and w["t_p"] >= 0 and w["t_c"] > 0
    plan = results["plan"]
    setup = plan["setup"]
    assert setup["warmup_end"] == 20 and setup["end"] > 20 and setup["history"] == w["losses"]
    for name, row in results["rows"].items():
        assert math.isfinite(row["predicted"]) and row["predicted"] > 0, name
        assert math.isfinite(row["measured"]) and row["measured"] > 0, name
        assert math.isfinite(row["hindsight"]["cil"]), name
        assert row["summary"]["requests"] == 25, name  # 5 s, one every 0.2 s
    producer = results["runs"]["ipp"]["producer"]
    state, initial = producer["policy"]["state"], producer["policy"]["initial"]
    # The producer's scheduler started from the plan the driver predicted with, before any step.
    assert initial["plans"] == 1 and initial["predicted_cil"] == pytest.approx(plan["predicted"]["ipp"], rel=1e-9)
    # It published exactly its answers, fed by the Publisher: stalls and ACK-based t_c replaced
    # the warm-up's estimates.
    assert [p["step"] for p in producer["publishes"]] == state["taken"]
    assert state["plans"] >= 1 and state["t_train"] > 0
    epoch = results["runs"]["epoch"]["producer"]
    gap = plan["epoch_iters"]
    assert [p["step"] for p in epoch["publishes"]] == list(range(20 + gap, 20 + gap * (len(epoch["publishes"]) + 1), gap))
    assert plot.exists() and plot.stat().st_size > 1000 and plot.read_text().lstrip().startswith("<?xml")
