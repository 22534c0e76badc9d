"""viper.Scheduler (the online Inference Performance Predictor) and viper.plan_schedules, from
Python, wired into a real Publisher with a real Subscriber."""
import math
import time

import numpy as np
import pytest

import viper
from helpers import wait_until


def loss_at(it):
    return 2.0 * math.exp(-0.002 * it) + 0.1


def test_plan_schedules_matches_the_cli_pipeline_and_optimal_is_best():
    losses = [(i, loss_at(i)) for i in range(0, 101)]
    result = viper.plan_schedules(losses, warmup_end=100, end=2000, epoch=200, t_train=0.01, t_p=0.2, t_c=0.1,
                                  t_infer=0.01, requests=5000)
    assert result["fit"]["family"] == "exp+c"
    assert result["fit"]["parameters"]["b"] == pytest.approx(0.002, rel=1e-4)
    by_name = {s["name"]: s for s in result["schedules"]}
    assert set(by_name) == {"none", "epoch", "fixed", "greedy", "sqrt", "optimal"}
    for s in by_name.values():
        assert by_name["optimal"]["cil"] <= s["cil"] + 1e-9, s["name"]
        assert s["checkpoints"] == len(s["schedule"])
    assert by_name["epoch"]["schedule"][:3] == [300, 500, 700]
    only = viper.plan_schedules(losses, warmup_end=100, end=2000, t_train=0.01, t_p=0.2, t_c=0.1, t_infer=0.01,
                                requests=5000, policies=["sqrt"])
    assert [s["name"] for s in only["schedules"]] == ["sqrt"]


def test_bad_inputs_raise_value_errors():
    with pytest.raises(ValueError, match="policy"):
        viper.Scheduler("bogus", warmup_end=1, end=2, t_infer=1, requests=1)
    with pytest.raises(ValueError):
        viper.Scheduler("optimal", warmup_end=10, end=10, t_infer=1, requests=1)  # e <= s
    with pytest.raises(ValueError):
        viper.Scheduler("optimal", warmup_end=1, end=10, t_infer=0, requests=1)
    s = viper.Scheduler("optimal", warmup_end=10, end=100, t_infer=0.01, requests=100)
    with pytest.raises(ValueError):
        s.observe(1, float("nan"))
    s.observe(2, 1.0)
    with pytest.raises(ValueError):
        s.observe(2, 1.0)  # iterations must increase
    with pytest.raises(ValueError):
        viper.plan_schedules([], warmup_end=1, end=10, t_train=1, t_p=0, t_c=0, t_infer=1, requests=1)


def test_online_scheduler_plans_close_to_the_offline_optimum():
    s = viper.Scheduler("optimal", warmup_end=100, end=2000, t_infer=0.01, requests=5000, t_train=0.01, t_p=0.2,
                        t_c=0.1, measure_t_train=False, robust_fit=False)
    due = [it for it in range(0, 2001) if s.step(it, loss_at(it))]
    state = s.state()
    assert due[0] == 100 and due[1:] == state["taken"]
    assert state["fit"]["family"] == "exp+c" and state["plans"] >= 1 and state["last_plan_status"] is None
    assert state["t_p"] == pytest.approx(0.2) and state["t_p_stall"] == 0 and state["t_p_measured"] == 0
    with pytest.raises(ValueError, match="checkpoint_cost_intervals"):
        viper.Scheduler("optimal", warmup_end=1, end=10, t_infer=0.01, requests=5, checkpoint_cost_intervals=-1)
    offline = viper.plan_schedules([(i, loss_at(i)) for i in range(101)], warmup_end=100, end=2000, t_train=0.01,
                                   t_p=0.2, t_c=0.1, t_infer=0.01, requests=5000, policies=["optimal"])
    assert state["predicted_cil"] == pytest.approx(offline["schedules"][0]["cil"], rel=1e-3)


def test_history_gives_the_prediction_before_the_run_and_evaluates_other_schedules():
    warmup = [(i, loss_at(i)) for i in range(101)]
    s = viper.Scheduler("greedy", warmup_end=100, end=2000, epoch=200, t_infer=0.01, requests=5000, t_train=0.01,
                        t_p=0.2, t_c=0.1, history=warmup, checkpoint_at_warmup_end=False)
    state = s.state()
    assert state["plans"] == 1 and state["plan_source"] == "fit" and state["planned"]
    offline = viper.plan_schedules(warmup, warmup_end=100, end=2000, epoch=200, t_train=0.01, t_p=0.2, t_c=0.1,
                                   t_infer=0.01, requests=5000, robust_fit=True)
    by_name = {p["name"]: p for p in offline["schedules"]}
    assert state["predicted_cil"] == pytest.approx(by_name["greedy"]["cil"], rel=1e-9)
    assert s.evaluate(by_name["epoch"]["schedule"]) == pytest.approx(by_name["epoch"]["cil"], rel=1e-9)
    assert "flat after" in offline["fit"]["formula"]  # robust: extrapolation bounded
    with pytest.raises(ValueError):
        s.evaluate([500, 400])
    fresh = viper.Scheduler("optimal", warmup_end=100, end=2000, t_infer=0.01, requests=5000)
    with pytest.raises(viper.Error):
        fresh.evaluate([200])


def test_publisher_publishes_when_due_and_feeds_the_scheduler():
    sched = viper.Scheduler("epoch", warmup_end=5, end=50, epoch=10, t_infer=0.01, requests=1000, t_train=0.001,
                            t_p=7.0, t_c=9.0)
    with viper.Publisher("m", mode="sync", scheduler=sched) as pub, \
            viper.Subscriber("m", connect=pub.address) as sub:
        published = []
        for it in range(51):
            r = pub.publish_if_due(it, loss_at(it), {"w": np.full(4096, it, dtype=np.float32)})
            if r is not None:
                published.append(it)
                live = sub.wait_for(r.version, timeout=10)
                assert live.step == it and float(live["w"][0]) == it
        state = sched.state()
        # Exactly the scheduler's answers: the warm-up model at s = 5, then what it took (a measured
        # t_p/t_c that moves an estimate by > 10% re-plans, so which epochs depends on timing).
        assert published == [5] + state["taken"] and len(published) >= 2
        assert all(b - a >= 10 for a, b in zip(published, published[1:]))
        assert 0 < state["t_p"] < 1.0  # measured stalls replaced the 7 s estimate
        # t_c comes from the subscriber's ACKs, received on the node's engine thread shortly after.
        wait_until(lambda: sched.state()["t_c"] != 9.0, 5, lambda: f"t_c replaced the 9 s estimate: {sched.state()}")
        assert 0 < sched.state()["t_c"] < 1.0  # measured, replacing the 9 s estimate
    with pytest.raises(TypeError):
        viper.Publisher("m", scheduler="optimal")
    with viper.Publisher("m") as plain, pytest.raises(viper.Error):
        plain.publish_if_due(1, 0.5, {"w": np.zeros(1, dtype=np.float32)})


def test_manual_ack_sets_t_c_when_the_application_serves_the_version():
    sched = viper.Scheduler("epoch", warmup_end=2, end=50, epoch=10, t_infer=0.01, requests=1000, t_train=0.001,
                            t_p=0.5, t_c=9.0, measure_t_train=False)
    with viper.Publisher("m", mode="sync", scheduler=sched) as pub, \
            viper.Subscriber("m", connect=pub.address, ack_on_live=False) as sub:
        r = pub.publish_if_due(2, loss_at(2), {"w": np.zeros(1024, dtype=np.float32)})
        assert r is not None
        live = sub.wait_for(r.version, timeout=10)
        time.sleep(0.3)  # live here, not acknowledged: the node was told nothing
        assert sched.state()["t_c"] == 9.0
        time.sleep(0.2)  # the application's own load
        sub.ack(live.version)
        wait_until(lambda: sched.state()["t_c"] != 9.0, 5, lambda: f"t_c replaced the 9 s estimate: {sched.state()}")
        assert 0.5 <= sched.state()["t_c"] < 5.0  # up to the ACK, after the application's 0.5 s
