"""examples/cl_demo/run_schedules.py: the same continual-learning run under IPP-chosen checkpoint
schedules (issue 6), with real producer and consumer processes over Viper. Small model, short runs."""
import json
import math
import os
import subprocess
import sys

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))


def test_schedules_run_and_report_predicted_beside_measured(tmp_path):
    out = tmp_path / "schedules.json"
    cmd = [sys.executable, os.path.join(EXAMPLES, "cl_demo", "run_schedules.py"), "--schedules", "epoch,optimal",
           "--model-mb", "2", "--duration", "6", "--period", "16", "--request-interval", "0.05",
           "--pretrain-iters", "40", "--t-p", "0.002", "--t-c", "0.01", "--workdir", str(tmp_path), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "predicted CIL" in proc.stdout and "measured CIL" in proc.stdout
    results = json.loads(out.read_text())
    assert set(results["schedules"]) == {"epoch", "optimal"}
    for name, run in results["schedules"].items():
        summary, policy = run["summary"], run["policy"]
        assert policy["policy"] == f"ipp-{name}"
        assert summary["versions_published"] >= 1 and summary["versions_loaded"] >= 1, name
        assert math.isfinite(summary["cil"]) and summary["cil"] > 0, name
        state = policy["state"]
        assert math.isfinite(state["predicted_cil"]) and state["predicted_cil"] > 0, name
        assert state["fit"] is not None and state["plans"] >= 1, name
        # Every policy predicted on the same fit and costs: optimal is the minimum.
        by_policy = policy["plan"]["predicted_cil_by_policy"]
        assert set(by_policy) >= {"none", "epoch", "fixed", "sqrt", "optimal"}
        assert all(by_policy["optimal"] <= v + 1e-9 for v in by_policy.values()), by_policy
        # Published steps are the scheduler's answers: the warm-up checkpoint, then those it took.
        producer = json.loads((tmp_path / f"run-sched-{name}" / "producer.json").read_text())
        steps = [p["step"] for p in producer["publishes"]]
        assert steps == [policy["plan"]["warmup_end"]] + state["taken"], name
