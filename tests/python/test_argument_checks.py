"""Every public entry point of the viper package checks its arguments before it does anything:
a wrong type raises TypeError, a value out of range InvalidArgumentError (a ValueError), each
one line that names the callable, the argument and the value (cut short, never a whole tensor).

Table-driven: each row is (entry point, argument, class of value); each class has its wrong types
and its out-of-range, negative, empty and overlong values."""
from __future__ import annotations

import collections
import math

import numpy as np
import pytest

import viper
import viper.data

HUGE = np.zeros(1 << 16, dtype=np.float32)  # a tensor passed where it does not belong
# class -> ([wrong types], [(value, why) the type accepts but the rule refuses])
CLASSES = {
    "int": ([1.5, "1", None, True, b"1", [1], HUGE], [(-1, "negative"), (2**70, "overlong"), (-(2**70), "overlong")]),
    "positive_int": ([1.5, "1", None, True, [1], HUGE], [(0, "out-of-range"), (-1, "negative"), (2**70, "overlong")]),
    "seconds": (["1", None, True, b"1", [1], HUGE],
                [(-5, "negative"), (math.inf, "out-of-range"), (math.nan, "malformed"), (1e300, "overlong")]),
    "optional_seconds": (["1", True, b"1", [1], HUGE], [(-5, "negative"), (math.inf, "out-of-range"),
                                                       (math.nan, "malformed"), (1e300, "overlong")]),
    "number": (["1", None, True, b"1", [1], HUGE], [(math.nan, "malformed"), (math.inf, "out-of-range")]),
    "optional_number": (["1", True, b"1", [1], HUGE], [(math.nan, "malformed"), (-math.inf, "out-of-range")]),
    "model": ([42, b"\xff", b"m", None, ["m"], HUGE],
              [("", "empty"), ("m" * 129, "overlong"), (".hidden", "malformed"), ("a/b", "malformed"),
               ("a\0b", "malformed"), ("caf\u00e9", "malformed")]),
    "address": ([42, b"127.0.0.1:1", None, HUGE],
                [("", "empty"), ("h" * 5000 + ":1", "overlong"), ("127.0.0.1", "malformed"),
                 ("127.0.0.1:65536", "out-of-range"), ("127.0.0.1:-1", "negative"), ("a b:1", "malformed")]),
    "path": ([42, None, b"p", HUGE], [("", "empty"), ("p" * 5000, "overlong"), ("a\0b", "malformed")]),
    "mapping": ([42, "w", [1], None, HUGE], []),
    "bool": ([1, "yes", None, HUGE], []),
    "sequence": ([42, "ab", b"ab", 1.5], []),
    "key": ([42, None, b"w", 1.5, HUGE], []),
    "sample_id": ([1.5, "1", None, True, HUGE], [(-1, "negative"), (2, "out-of-range"), (2**70, "overlong")]),
}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A publisher with one version, a subscriber that has it, a standalone node, a snapshot and a scheduler."""
    pub = viper.Publisher("checks")
    pub.publish({"w": np.arange(4, dtype=np.float32)}, step=1)
    result = pub.publish({"w": np.arange(4, dtype=np.float32)}, step=2)
    pub.wait(30)
    sub = viper.Subscriber("checks", connect=pub.address)
    version = sub.wait_for(1, timeout=30)
    records = tmp_path_factory.mktemp("records") / "r.rec"
    viper.data.write_records(records, [(b"abcd", 0), (b"efgh", 1)])
    source = viper.data.open_source(records)
    node = viper.Node()
    snap = viper.build_snapshot({"w": np.zeros(2, dtype=np.float32)})
    sched = viper.Scheduler(warmup_end=10, end=100, t_infer=1.0, requests=10)
    yield {"pub": pub, "sub": sub, "node": node, "snap": snap, "sched": sched, "result": result, "version": version,
           "source": source}
    sub.close()
    pub.close()
    node.close()


T = {"w": np.zeros(2, dtype=np.float32)}
PLAN = dict(warmup_end=2, end=10, t_train=1.0, t_p=0.0, t_c=0.0, t_infer=1.0, requests=5)
SCHED = dict(warmup_end=10, end=100, t_infer=1.0, requests=10)

# (name shown in the message, argument, class, call(live, value))
ENTRY_POINTS = [
    ("viper.Node()", "listen", "address", lambda L, v: viper.Node(listen=v)),
    ("Node.latest()", "model", "model", lambda L, v: L["node"].latest(v)),
    ("Node.wait_flushed()", "timeout", "seconds", lambda L, v: L["node"].wait_flushed(v)),
    ("viper.Publisher()", "model", "model", lambda L, v: viper.Publisher(v)),
    ("viper.Publisher()", "listen", "address", lambda L, v: viper.Publisher("m", listen=v)),
    ("viper.Publisher()", "scheduler", "mapping", lambda L, v: viper.Publisher("m", scheduler=v if v is not None else 1)),
    ("Publisher.publish()", "tensors", "mapping", lambda L, v: L["pub"].publish(v)),
    ("Publisher.prepare()", "tensors", "mapping", lambda L, v: L["pub"].prepare(v)),
    ("Publisher.publish()", "step", "int", lambda L, v: L["pub"].publish(T, step=v)),
    ("Publisher.publish()", "loss", "optional_number", lambda L, v: L["pub"].publish(T, loss=v)),
    ("Publisher.publish_if_due()", "iteration", "int", lambda L, v: L["pub"].publish_if_due(v, 1.0, T)),
    ("Publisher.publish_if_due()", "loss", "number", lambda L, v: L["pub"].publish_if_due(1, v, T)),
    ("Publisher.publish_if_due()", "tensors", "mapping", lambda L, v: L["pub"].publish_if_due(1, 1.0, v)),
    ("Publisher.wait()", "timeout", "seconds", lambda L, v: L["pub"].wait(v)),
    ("viper.Subscriber()", "model", "model", lambda L, v: viper.Subscriber(v)),
    ("viper.Subscriber()", "connect", "address", lambda L, v: viper.Subscriber("m", connect=v)),
    ("Subscriber.wait_for()", "version", "int", lambda L, v: L["sub"].wait_for(v, timeout=1)),
    ("Subscriber.wait_for()", "timeout", "seconds", lambda L, v: L["sub"].wait_for(1, timeout=v)),
    ("Subscriber.wait()", "timeout", "seconds", lambda L, v: L["sub"].wait(v)),
    ("Subscriber.load_into()", "module", "mapping", lambda L, v: L["sub"].load_into(v)),
    ("Subscriber.load_into()", "version", "mapping", lambda L, v: L["sub"].load_into({}, version=v if v is not None else 1)),
    ("Subscriber.load_into()", "strict", "bool", lambda L, v: L["sub"].load_into({}, strict=v)),
    ("Subscriber.ack()", "version", "positive_int", lambda L, v: L["sub"].ack(v)),
    ("viper.build_snapshot()", "tensors", "mapping", lambda L, v: viper.build_snapshot(v)),
    ("viper.build_snapshot()", "version", "int", lambda L, v: viper.build_snapshot(T, version=v)),
    ("viper.build_snapshot()", "step", "int", lambda L, v: viper.build_snapshot(T, step=v)),
    ("viper.build_snapshot()", "loss", "optional_number", lambda L, v: viper.build_snapshot(T, loss=v)),
    ("viper.build_snapshot()", "alignment", "positive_int", lambda L, v: viper.build_snapshot(T, alignment=v)),
    ("Snapshot.open()", "path", "path", lambda L, v: viper.Snapshot.open(v)),
    ("Snapshot.open()", "verify", "bool", lambda L, v: viper.Snapshot.open("x", verify=v)),
    ("Snapshot.from_bytes()", "data", "mapping", lambda L, v: viper.Snapshot.from_bytes(v)),
    ("Snapshot.save()", "path", "path", lambda L, v: L["snap"].save(v)),
    ("Snapshot[]", "name", "key", lambda L, v: L["snap"][v]),
    ("ModelVersion[]", "name", "key", lambda L, v: L["version"][v]),
    ("PublishResult.wait_delta()", "timeout", "seconds", lambda L, v: L["result"].wait_delta(v)),
    ("Source.read()", "sample_id", "sample_id", lambda L, v: L["source"].read(v)),
    ("Source.nbytes()", "sample_id", "sample_id", lambda L, v: L["source"].nbytes(v)),
    ("Source.label()", "sample_id", "sample_id", lambda L, v: L["source"].label(v)),
    ("Source.describe()", "sample_id", "sample_id", lambda L, v: L["source"].describe(v)),
    ("viper.Scheduler()", "policy", "model", lambda L, v: viper.Scheduler(v, **SCHED)),
    ("viper.Scheduler()", "warmup_end", "int", lambda L, v: viper.Scheduler(**dict(SCHED, warmup_end=v))),
    ("viper.Scheduler()", "end", "int", lambda L, v: viper.Scheduler(**dict(SCHED, end=v))),
    ("viper.Scheduler()", "epoch", "int", lambda L, v: viper.Scheduler(**dict(SCHED, epoch=v))),
    ("viper.Scheduler()", "t_infer", "seconds", lambda L, v: viper.Scheduler(**dict(SCHED, t_infer=v))),
    ("viper.Scheduler()", "requests", "positive_int", lambda L, v: viper.Scheduler(**dict(SCHED, requests=v))),
    ("viper.Scheduler()", "t_train", "seconds", lambda L, v: viper.Scheduler(**dict(SCHED, t_train=v))),
    ("viper.Scheduler()", "t_p", "seconds", lambda L, v: viper.Scheduler(**dict(SCHED, t_p=v))),
    ("viper.Scheduler()", "t_c", "seconds", lambda L, v: viper.Scheduler(**dict(SCHED, t_c=v))),
    ("viper.Scheduler()", "refit_every", "int", lambda L, v: viper.Scheduler(**dict(SCHED, refit_every=v))),
    ("viper.Scheduler()", "duration", "seconds", lambda L, v: viper.Scheduler(**dict(SCHED, duration=v))),
    ("viper.Scheduler()", "history", "sequence", lambda L, v: viper.Scheduler(**dict(SCHED, history=v))),
    ("viper.Scheduler()", "robust_fit", "bool", lambda L, v: viper.Scheduler(**dict(SCHED, robust_fit=v))),
    ("Scheduler.observe()", "iteration", "int", lambda L, v: L["sched"].observe(v, 1.0)),
    ("Scheduler.observe()", "loss", "number", lambda L, v: L["sched"].observe(1, v)),
    ("Scheduler.should_checkpoint()", "iteration", "int", lambda L, v: L["sched"].should_checkpoint(v)),
    ("Scheduler.step()", "iteration", "int", lambda L, v: L["sched"].step(v, 1.0)),
    ("Scheduler.report_publish_stall()", "seconds", "seconds", lambda L, v: L["sched"].report_publish_stall(v)),
    ("Scheduler.report_update_latency()", "seconds", "seconds", lambda L, v: L["sched"].report_update_latency(v)),
    ("Scheduler.evaluate()", "schedule", "sequence", lambda L, v: L["sched"].evaluate(v)),
    ("viper.plan_schedules()", "losses", "sequence", lambda L, v: viper.plan_schedules(v, **PLAN)),
    ("viper.plan_schedules()", "warmup_end", "int", lambda L, v: viper.plan_schedules([], **dict(PLAN, warmup_end=v))),
    ("viper.plan_schedules()", "t_train", "seconds", lambda L, v: viper.plan_schedules([], **dict(PLAN, t_train=v))),
    ("viper.plan_schedules()", "requests", "positive_int", lambda L, v: viper.plan_schedules([], **dict(PLAN, requests=v))),
    ("viper.plan_schedules()", "policies", "sequence", lambda L, v: viper.plan_schedules([], **dict(PLAN, policies=v))),
    ("viper.data.open_source()", "path", "path", lambda L, v: viper.data.open_source(v)),
    ("viper.data.write_records()", "path", "path", lambda L, v: viper.data.write_records(v, [])),
    ("viper.data.write_records()", "samples", "sequence", lambda L, v: viper.data.write_records("/tmp/x.rec", v)),
    ("viper.data.Prefetcher()", "ids", "sequence", lambda L, v: viper.data.Prefetcher("/nonexistent", ids=v)),
    ("viper.data.DataLoader()", "batch_size", "positive_int", lambda L, v: viper.data.DataLoader("/nonexistent", v)),
    ("viper.data.DataLoader()", "drop_last", "bool", lambda L, v: viper.data.DataLoader("/nonexistent", drop_last=v)),
    ("viper.data.RehearsalBuffer()", "capacity", "positive_int",
     lambda L, v: viper.data.RehearsalBuffer(v, sample_shape=[2])),
    ("viper.data.RehearsalBuffer()", "ratio", "number",
     lambda L, v: viper.data.RehearsalBuffer(4, sample_shape=[2], ratio=v)),
    ("viper.data.RehearsalBuffer()", "sample_shape", "sequence", lambda L, v: viper.data.RehearsalBuffer(4, sample_shape=v)),
]


def _one_line(message: str, owner: str, argument: str) -> None:
    assert "\n" not in message, message
    assert len(message) < 400, f"{len(message)} characters: {message[:200]}"
    assert owner in message, message
    assert argument in message, message
    assert "incompatible function arguments" not in message, message


TRIED = collections.Counter()


@pytest.mark.parametrize("owner,argument,kind,call", ENTRY_POINTS, ids=[f"{o}-{a}" for o, a, _, _ in ENTRY_POINTS])
def test_wrong_types_and_values_are_refused(live, owner, argument, kind, call):
    wrong_types, wrong_values = CLASSES[kind]
    for value in wrong_types:
        with pytest.raises(TypeError) as e:
            call(live, value)
        _one_line(str(e.value), owner, argument)
        TRIED["wrong type"] += 1
    for value, why in wrong_values:
        # An index out of range is an IndexError (Source.read(10_000)); every other rule a ValueError.
        with pytest.raises(IndexError if kind == "sample_id" else ValueError) as e:
            call(live, value)
        assert kind == "sample_id" or isinstance(e.value, viper.InvalidArgumentError), repr(e.value)
        _one_line(str(e.value), owner, argument)
        assert "must be" in str(e.value), str(e.value)
        TRIED[why] += 1


def _option_fields(options_class):
    """(name, default) of every keyword of an options class."""
    defaults = options_class()
    return [(name, getattr(defaults, name)) for name in dir(options_class)
            if not name.startswith("_") and isinstance(getattr(options_class, name), property)]


OPTION_OWNERS = [
    ("viper.Node()", viper._viper._NodeOptions, lambda **kw: viper.Node(**kw)),
    ("viper.Publisher()", viper._viper._PublisherOptions, lambda **kw: viper.Publisher("m", **kw)),
    ("viper.Subscriber()", viper._viper._SubscriberOptions, lambda **kw: viper.Subscriber("m", **kw)),
    ("viper.data.Prefetcher()", viper._viper._PrefetchOptions, lambda **kw: viper.data.Prefetcher("/nonexistent", **kw)),
]


@pytest.mark.parametrize("owner,options_class,make", OPTION_OWNERS, ids=[o for o, _, _ in OPTION_OWNERS])
def test_every_keyword_option_checks_its_type_and_range(owner, options_class, make):
    fields = _option_fields(options_class)
    assert len(fields) >= 2, owner
    for name, default in fields:
        if name in ("listen", "connect", "model"):
            continue  # positional-or-keyword arguments of the public callable, in ENTRY_POINTS
        if isinstance(default, bool):
            wrong_types, wrong_values = [1, "yes", None], []
        elif isinstance(default, int):
            wrong_types, wrong_values = ["1", 1.5, None, b"1", HUGE], [2**70, -(2**70)]
        elif isinstance(default, float):
            wrong_types, wrong_values = ["1", None, b"1", HUGE], [-1.0, math.inf, math.nan]
        elif isinstance(default, str):
            wrong_types, wrong_values = [42, b"x", None, HUGE], []
        elif isinstance(default, list):  # of str (Subscriber(alternates=)): a lone str is no list
            wrong_types, wrong_values = ["127.0.0.1:7300", [42], None, 42], []
        else:
            continue
        for value in wrong_types:
            with pytest.raises(TypeError) as e:
                make(**{name: value})
            _one_line(str(e.value), owner, name)
            TRIED["wrong type"] += 1
        for value in wrong_values:
            with pytest.raises(ValueError) as e:
                make(**{name: value})
            _one_line(str(e.value), owner, name)
            TRIED["overlong" if abs(value) > 1e18 else "out-of-range"] += 1


def test_found_instances(live):
    with pytest.raises(TypeError, match=r"viper.Publisher\(\): model=b'\\xff': expected a str, got bytes"):
        viper.Publisher(b"\xff")
    assert 42 not in live["snap"] and "w" in live["snap"]
    with pytest.raises(viper.InvalidArgumentError, match=r"step=1180591620717411303424: must be an int from 0 to"):
        live["pub"].publish({"w": np.zeros(1 << 20, dtype=np.float32)}, step=2**70)
    with pytest.raises(TypeError, match=r"Subscriber.load_into\(\): module=42: expected a torch module or a mapping"):
        live["sub"].load_into(42)


def test_a_publisher_refuses_an_alignment_it_cannot_lay_out():
    """Publisher(alignment=3) (also 0 or 2**64 - 1) was accepted and every publish() then failed."""
    for alignment in (0, 3, 8192, 2**64 - 1):
        with pytest.raises(viper.InvalidArgumentError, match=rf"alignment {alignment} is not a power of two in "
                                                              rf"\[1, 4096\]"):
            viper.Publisher("m", alignment=alignment)
    for alignment in (1, 4096):
        with viper.Publisher("m", alignment=alignment) as pub:
            pub.publish(T)


def test_a_subscriber_refuses_path_file_without_file_dir(live):
    """Subscriber(path="file") without file_dir read ./MODEL/ of the current directory until
    wait_for timed out; the CLI's watch refuses --path file without --file-dir."""
    with pytest.raises(viper.InvalidArgumentError, match=r"path=file needs file_dir \(the node's store_dir"):
        viper.Subscriber("checks", connect=live["pub"].address, path="file")


def test_text_with_a_lone_surrogate_is_refused_by_name(live):
    """A str may hold a lone surrogate (os.fsdecode of undecodable bytes) that UTF-8 cannot encode:
    it got pybind's "Unable to cast Python instance to C++ type", naming nothing."""
    with pytest.raises(viper.InvalidArgumentError, match=r"tensor name='w\\udc80': must be valid Unicode text "
                                                          r"\(a lone surrogate at position 1\)"):
        live["pub"].publish({"w\udc80": np.zeros(4, dtype=np.float32)})
    with pytest.raises(viper.InvalidArgumentError, match=r"note='x\\ud800': must be valid Unicode text"):
        live["pub"].publish(T, note="x\ud800")


def test_zz_report_counts():
    """Prints the inputs tried per class (docs/RELIABILITY.md quotes them)."""
    total = sum(TRIED.values())
    print(f"\ninputs tried: {total} over {len(ENTRY_POINTS)} arguments and the keyword options of "
          f"{len(OPTION_OWNERS)} classes: " + ", ".join(f"{k} {v}" for k, v in sorted(TRIED.items())))
    assert total > 300
