"""PyTorch conventions of the viper package: a received version as a state_dict, the exception
names that do not shadow the builtins, state_dict()/load_state_dict() of RehearsalBuffer and
Scheduler, DataLoader's defaults. Real publisher, real subscriber, real shared memory."""
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import viper
import viper.data


class Net(torch.nn.Module):
    """Parameters and buffers of several dtypes, bf16 included."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)
        self.head = torch.nn.Linear(8, 4).to(torch.bfloat16)
        self.norm = torch.nn.BatchNorm1d(8)  # float buffers and an int64 one (num_batches_tracked)
        self.register_buffer("halves", torch.randn(3, 5).half())
        self.register_buffer("mask", torch.rand(7) > 0.5)


def bits(t: torch.Tensor) -> bytes:
    """The tensor's bytes, for bit-exact comparisons (NaN-safe, bf16 included)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def test_load_state_dict_of_a_real_module_from_a_subscribers_version_is_bit_exact(pair):
    pub, sub = pair
    torch.manual_seed(3)
    src = Net()
    src.norm.running_mean.uniform_()
    src.norm.num_batches_tracked.fill_(17)
    pub.publish(src.state_dict(), step=5)
    version = sub.wait_for(1, timeout=30)
    assert version.path == "map", version.reason

    state = version.state_dict()
    assert list(state) == list(version.keys())
    assert state["head.weight"].dtype == torch.bfloat16  # bf16 as bf16, not uint16 bits
    assert state["norm.num_batches_tracked"].dtype == torch.int64
    # Views, not copies: every tensor's memory is inside the version's buffer (the node's segment).
    lo, hi = version.buffer_address, version.buffer_address + version.nbytes
    for name, t in state.items():
        assert lo <= t.data_ptr() < hi or t.numel() == 0, name

    dst = Net()
    torch.manual_seed(99)
    for p in dst.parameters():
        torch.nn.init.normal_(p)
    dst.load_state_dict(state)  # strict: every key, every shape
    for name, want in src.state_dict().items():
        got = dst.state_dict()[name]
        assert got.dtype == want.dtype and bits(got) == bits(want), name

    owned = viper.to_state_dict(version, copy=True)
    assert all(not (lo <= t.data_ptr() < hi) for t in owned.values())
    owned["fc.bias"].add_(1.0)  # its own memory: the version is untouched
    assert bits(version.state_dict()["fc.bias"]) == bits(src.fc.bias)


@pytest.mark.parametrize("path", ["map", "copy"])  # the node's segment; a recycled receive buffer
def test_state_dict_tensors_keep_the_version_alive_after_the_subscriber_moves_on(path):
    with viper.Publisher("m", mode="sync") as pub, viper.Subscriber("m", connect=pub.address, path=path) as sub:
        keeps_alive(pub, sub, path)


def keeps_alive(pub, sub, path):
    pub.publish({"w": torch.full((4096,), 1.0), "b": torch.full((8,), 1.0).bfloat16()})
    first = sub.wait_for(1, timeout=30)
    assert first.path == path, first.reason
    state = first.state_dict()
    del first  # the tensors alone hold the version now
    ptr = state["w"].data_ptr()
    for v in range(2, 7):  # retention keeps 2 versions: version 1's segment would be recycled
        pub.publish({"w": torch.full((4096,), float(v)), "b": torch.full((8,), float(v)).bfloat16()})
        sub.wait_for(v, timeout=30)
    assert state["w"].data_ptr() == ptr
    assert bool((state["w"] == 1.0).all()) and bool((state["b"].float() == 1.0).all())
    w = state.pop("w")
    del state  # the last tensor alone still holds the version
    for v in range(7, 10):
        pub.publish({"w": torch.full((4096,), float(v)), "b": torch.full((8,), float(v)).bfloat16()})
        sub.wait_for(v, timeout=30)
    assert bool((w == 1.0).all())


def test_f8_and_unsigned_tensors_follow_the_documented_fallbacks(tmp_path):
    f8 = np.arange(16, dtype=np.uint8)
    snap = viper.Snapshot._build([("e4", "F8_E4M3", [16], f8), ("e5", "F8_E5M2", [16], f8),
                                  ("u16", "U16", [3], np.array([1, 2, 65535], dtype=np.uint16)),
                                  ("f", "F32", [2], np.array([1.5, -2.0], dtype=np.float32))],
                                 "m", 1, 0, None, {}, 64)
    try:
        viper.to_state_dict(snap)
        u16_ok = True
    except TypeError as e:
        u16_ok = False
        assert "'u16'" in str(e) and "uint16" in str(e), e
    assert u16_ok == hasattr(torch, "uint16")
    dtypes = viper._tensors._NEWER_TORCH_DTYPES
    for name, kind in (("e4", "F8_E4M3"), ("e5", "F8_E5M2")):
        t = viper._tensors.as_torch(snap[name], kind, name)
        want = getattr(torch, dtypes[kind][0], torch.uint8)
        assert t.dtype == want, (name, t.dtype)
        assert t.view(torch.uint8).numpy().tobytes() == f8.tobytes()  # the bits, unchanged
    with pytest.raises(TypeError, match="copy="):
        viper.to_state_dict(snap, copy="yes")
    with pytest.raises(TypeError, match="version="):
        viper.to_state_dict({"x": torch.zeros(1)})


def test_writing_into_a_mapped_view_kills_the_process_as_documented():
    """to_state_dict's docstring says that a write into a "map" version's tensor is SIGSEGV."""
    script = textwrap.dedent("""
        import sys, torch, viper
        with viper.Publisher("m", mode="sync") as pub, viper.Subscriber("m", connect=pub.address) as sub:
            pub.publish({"w": torch.zeros(1024)})
            v = sub.wait_for(1, timeout=30)
            assert v.path == "map", v.reason
            t = v.state_dict()["w"]
            print("writing", flush=True)
            t.add_(1.0)
            print("survived", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "writing" in proc.stdout and "survived" not in proc.stdout, (proc.stdout, proc.stderr)
    assert proc.returncode == -11, (proc.returncode, proc.stderr)


def test_error_classes_do_not_shadow_the_builtins_under_star_import():
    ns: dict = {}
    exec("from viper import *", ns)  # noqa: S102
    assert "TimeoutError" not in ns and "IOError" not in ns
    assert ns["ViperTimeoutError"] is viper.ViperTimeoutError and ns["ViperIOError"] is viper.ViperIOError
    assert issubclass(viper.ViperTimeoutError, TimeoutError) and issubclass(viper.ViperTimeoutError, viper.Error)
    assert issubclass(viper.ViperIOError, OSError) and issubclass(viper.ViperIOError, viper.Error)
    # The former names are the same classes, for older callers.
    assert viper.TimeoutError is viper.ViperTimeoutError and viper.IOError is viper.ViperIOError
    assert viper.ViperTimeoutError.__module__ == "viper" and viper.ViperTimeoutError.__name__ == "ViperTimeoutError"
    with viper.Publisher("m") as pub, viper.Subscriber("m", connect=pub.address) as sub:
        with pytest.raises(viper.ViperTimeoutError):
            sub.wait_for(1, timeout=0.1)
    with pytest.raises(viper.ViperIOError):
        viper.Subscriber("m", connect="127.0.0.1:1", request_timeout=2)


def save_and_load(state, tmp_path, name):
    """Through torch.save / torch.load, as a job saves its state_dicts. (torch 1.13's weights_only
    unpickler refuses even floats, so it is not used here.)"""
    path = tmp_path / name
    torch.save(state, path)
    return torch.load(path)


def rehearsal(seed, **kw):
    return viper.data.RehearsalBuffer(12, sample_shape=(3,), dtype="float32", ratio=0.5, policy="class_balanced",
                                      seed=seed, **kw)


def stream(rng, n):
    return rng.standard_normal((n, 3)).astype(np.float32), rng.integers(0, 4, size=n)


@pytest.mark.parametrize("policy", ["reservoir", "class_balanced"])
def test_rehearsal_buffer_state_dict_resumes_exactly(tmp_path, policy):
    rng = np.random.default_rng(5)
    a = viper.data.RehearsalBuffer(12, sample_shape=(3,), dtype="float32", policy=policy, seed=1)
    for _ in range(6):
        a.add(*stream(rng, 7))
    state = a.state_dict()
    assert state["samples"].shape == (12, 3) and state["samples"].dtype == torch.float32
    assert state["seen"] == 42 and sum(state["class_seen"].values()) == 42
    b = viper.data.RehearsalBuffer(12, sample_shape=(3,), dtype="float32", policy=policy, seed=999)
    b.add(*stream(np.random.default_rng(0), 5))  # replaced wholesale
    b.load_state_dict(save_and_load(state, tmp_path, "rehearsal.pt"))
    assert len(b) == len(a) and b.seen == a.seen and b.class_counts == a.class_counts
    # The same later calls give the same samples: contents, sampler order and generator resumed.
    for _ in range(5):
        x, y = stream(rng, 9)
        assert a.add(x, y) == b.add(x, y)
        xa, ya = a.sample(6, as_numpy=True)
        xb, yb = b.sample(6, as_numpy=True)
        assert xa.tobytes() == xb.tobytes() and (ya == yb).all()
    assert a.class_counts == b.class_counts and a.class_seen == b.class_seen


def test_rehearsal_buffer_load_state_dict_refuses_what_does_not_fit():
    rng = np.random.default_rng(1)
    a = rehearsal(1)
    a.add(*stream(rng, 20))
    state = a.state_dict()
    other = viper.data.RehearsalBuffer(12, sample_shape=(4,), dtype="float32", policy="class_balanced")
    with pytest.raises(viper.InvalidArgumentError, match="sample_shape"):
        other.load_state_dict(state)
    with pytest.raises(viper.InvalidArgumentError, match="policy"):
        viper.data.RehearsalBuffer(12, sample_shape=(3,), dtype="float32").load_state_dict(state)
    with pytest.raises(viper.InvalidArgumentError, match="capacity"):
        viper.data.RehearsalBuffer(4, sample_shape=(3,), dtype="float32",
                                   policy="class_balanced").load_state_dict(state)
    b = rehearsal(2)
    b.add(*stream(rng, 3))
    before = (len(b), b.seen, b.class_counts)
    bad = dict(state, members=torch.zeros_like(state["members"]))
    with pytest.raises(viper.InvalidArgumentError, match="members"):
        b.load_state_dict(bad)
    with pytest.raises(viper.InvalidArgumentError, match="seen"):
        b.load_state_dict(dict(state, seen=state["seen"] + 1))
    with pytest.raises(viper.InvalidArgumentError, match="rng"):
        b.load_state_dict(dict(state, rng="not a generator"))
    with pytest.raises(viper.InvalidArgumentError, match="lacks"):
        b.load_state_dict({k: v for k, v in state.items() if k != "labels"})
    assert (len(b), b.seen, b.class_counts) == before  # unchanged by every refusal


def loss_at(it):
    return 2.0 * np.exp(-0.002 * it) + 0.1 + 0.01 * np.sin(it)


def scheduler(**kw):
    options = dict(warmup_end=100, end=2000, t_infer=0.01, requests=5000, t_train=0.01, t_p=0.2, t_c=0.1,
                   measure_t_train=False)
    options.update(kw)
    return viper.Scheduler("optimal", **options)


def comparable(state):
    return {k: v for k, v in state.items() if k != "last_plan_status"}


def test_scheduler_state_dict_resumes_the_same_plan_and_decisions(tmp_path):
    a = scheduler()
    due_a = []
    for it in range(0, 777):
        if a.step(it, float(loss_at(it))):
            due_a.append(it)
        if it % 50 == 0:
            a.report_update_latency(0.08 + it * 1e-5)
            a.report_publish_stall(0.01)
    state = save_and_load(a.state_dict(), tmp_path, "scheduler.pt")
    b = scheduler()
    b.load_state_dict(state)
    assert comparable(b.state()) == comparable(a.state())
    assert a.state()["plans"] >= 3 and a.state()["planned"], a.state()
    due_b = list(due_a)
    for it in range(777, 2001):
        loss = float(loss_at(it))
        if a.step(it, loss):
            due_a.append(it)
        if b.step(it, loss):
            due_b.append(it)
    assert due_a == due_b and len(due_a) > 3
    assert comparable(b.state()) == comparable(a.state())


def test_scheduler_state_dict_keeps_the_measured_estimates():
    a = scheduler(measure_t_train=True, t_train=0.0)
    for it in range(0, 150):
        a.step(it, float(loss_at(it)))
        time.sleep(0.0005)
    a.report_publish_stall(0.03)
    b = scheduler(measure_t_train=True, t_train=0.0)
    b.load_state_dict(a.state_dict())
    sa, sb = a.state(), b.state()
    for key in ("iteration", "t_train", "t_p", "t_c", "t_p_stall", "taken", "plans", "fit", "predicted_cil"):
        assert sa[key] == sb[key], key
    assert sa["t_train"] > 0


def test_scheduler_load_state_dict_refuses_another_run():
    a = scheduler()
    for it in range(0, 120):
        a.step(it, float(loss_at(it)))
    state = a.state_dict()
    with pytest.raises(viper.InvalidArgumentError, match="end"):
        scheduler(end=3000).load_state_dict(state)
    b = scheduler()
    with pytest.raises(viper.InvalidArgumentError, match="format"):
        b.load_state_dict(dict(state, format="torch"))
    with pytest.raises(ValueError, match="losses"):
        b.load_state_dict(dict(state, losses=[(5, 1.0), (4, 1.0)]))
    with pytest.raises(TypeError, match="state"):
        b.load_state_dict([1, 2])
    assert b.state()["iteration"] == -1 and b.state()["plans"] == 0  # unchanged


def test_dataloader_documents_why_shuffle_defaults_to_true():
    import inspect
    assert inspect.signature(viper.data.DataLoader).parameters["shuffle"].default is True
    doc = viper.data.DataLoader.__doc__
    assert "unlike torch's DataLoader" in doc and "ordered=True" in doc
