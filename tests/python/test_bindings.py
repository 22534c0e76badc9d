"""The `viper` Python package (python/viper, extension python/src): real publishers, subscribers and
shared-memory segments, in this process and in another one.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_bindings.py
(CTest sets PYTHONPATH; an `import viper` failure is an error here, not a skip.)
"""
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import viper

NUMPY_DTYPES = ["float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"]
TORCH_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
                torch.int8, torch.uint8, torch.bool]


def numpy_sample(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(size=shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def test_numpy_round_trip_every_dtype_with_empty_and_scalar_tensors(pair):
    pub, sub = pair
    tensors = {}
    for i, dtype in enumerate(NUMPY_DTYPES):
        tensors[f"{dtype}.matrix"] = numpy_sample(dtype, (7, 5), i)
        tensors[f"{dtype}.scalar"] = numpy_sample(dtype, (), 100 + i)
        tensors[f"{dtype}.empty"] = numpy_sample(dtype, (0, 3), 200 + i)
    result = pub.publish(tensors, step=42, loss=0.25, run="a")
    assert result.version == 1 and result.bytes > 0 and result.stall_seconds >= 0
    got = sub.wait_for(1, timeout=30)
    assert got.version == 1 and got.step == 42 and got.model == "m"
    assert got.metadata["run"] == "a" and float(got.metadata["viper.loss"]) == 0.25
    assert sorted(got.keys()) == sorted(tensors)
    for name, want in tensors.items():
        view = got[name]
        assert view.dtype == want.dtype and view.shape == want.shape, name
        np.testing.assert_array_equal(view, want)
        assert not view.flags.writeable, name


def test_torch_round_trip_every_dtype(pair):
    pub, sub = pair
    torch.manual_seed(0)
    state = {}
    for dtype in TORCH_DTYPES:
        name = str(dtype).split(".")[1]
        if dtype.is_floating_point:
            state[name] = torch.randn(6, 4).to(dtype)
        elif dtype == torch.bool:
            state[name] = torch.rand(6, 4) > 0.5
        else:
            state[name] = torch.randint(-100 if dtype != torch.uint8 else 0, 100, (6, 4), dtype=dtype)
    state["strided"] = torch.arange(24, dtype=torch.float32).reshape(4, 6).t()  # not contiguous
    pub.publish(state, step=1)
    got = sub.wait_for(1, timeout=30)
    assert got.dtypes["bfloat16"][0] == "BF16"
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    sub.load_into(target)
    for name, want in state.items():
        assert target[name].dtype == want.dtype
        assert torch.equal(target[name], want), name


def shm_mapping_of(address):
    """The /proc/self/maps line whose range holds `address`, or None."""
    with open("/proc/self/maps", encoding="utf-8") as f:
        for line in f:
            span, rest = line.split(" ", 1)
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return line.strip()
    return None


def test_views_are_zero_copy_into_the_shared_memory_segment(pair):
    pub, sub = pair
    pub.publish({"w": np.arange(1 << 20, dtype=np.float32), "b": np.ones(16, dtype=np.float64)})
    got = sub.wait_for(1, timeout=30)
    assert got.path == "map", got.reason
    w = got["w"]
    mapping = shm_mapping_of(w.ctypes.data)
    assert mapping is not None and "/dev/shm/viper" in mapping, mapping
    assert got.buffer_address <= w.ctypes.data < got.buffer_address + got.nbytes
    assert np.shares_memory(got["w"], w)  # a second lookup is the same memory, not a copy
    with pytest.raises(ValueError):
        w[0] = 1.0  # read-only: it is the node's segment


def test_a_view_keeps_its_version_alive_after_newer_ones(pair):
    pub, sub = pair
    pub.publish({"x": np.full(1000, 1, dtype=np.int32)})
    old = sub.wait_for(1, timeout=30)["x"]
    for v in range(2, 6):  # retention keeps 2 versions: version 1's segment would be recycled
        pub.publish({"x": np.full(1000, v, dtype=np.int32)})
        sub.wait_for(v, timeout=30)
    assert (old == 1).all()  # the lease held through the view kept it intact


def test_load_into_keeps_parameter_identity_and_storage(pair):
    pub, sub = pair
    torch.manual_seed(1)
    producer = torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3), torch.nn.BatchNorm1d(4), torch.nn.Linear(8, 3))
    consumer = torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3), torch.nn.BatchNorm1d(4), torch.nn.Linear(8, 3))
    producer[1].running_mean.fill_(3.0)
    before = {name: (id(p), p.data_ptr()) for name, p in consumer.named_parameters()}
    buffers_before = {name: b.data_ptr() for name, b in consumer.named_buffers()}
    pub.publish(producer.state_dict(), step=7)
    sub.wait_for(1, timeout=30)
    loaded = sub.load_into(consumer)
    assert loaded.version == 1
    for name, p in consumer.named_parameters():
        assert (id(p), p.data_ptr()) == before[name], name
    assert {name: b.data_ptr() for name, b in consumer.named_buffers()} == buffers_before
    for (name, a), (_, b) in zip(producer.state_dict().items(), consumer.state_dict().items()):
        assert torch.equal(a, b), name


def test_load_into_refuses_a_mismatch_and_leaves_the_module_untouched(pair):
    pub, sub = pair
    pub.publish({"weight": np.ones((3, 4), dtype=np.float32), "bias": np.ones(5, dtype=np.float32)})
    sub.wait_for(1, timeout=30)
    module = torch.nn.Linear(4, 3)
    weight = module.weight.detach().clone()
    with pytest.raises(ValueError, match="shape"):
        sub.load_into(module)
    assert torch.equal(module.weight.detach(), weight)


CONSUMER = textwrap.dedent("""
    import sys, viper
    sub = viper.Subscriber("m", connect=sys.argv[1])
    seen = []
    while not seen or seen[-1] < 3:
        try:
            v = sub.wait(timeout=60)
        except viper.ViperTimeoutError:
            # What the subscriber saw (announcements, loads, failures), for the report of a lost update.
            print("subscriber stats:", sub.stats(), file=sys.stderr, flush=True)
            raise
        seen.append(v.version)
        print(v.version, int(v["x"].sum()), v.path, flush=True)
    sub.close()
""")


def test_a_consumer_in_another_process_sees_every_update():
    with viper.Publisher("m", listen="127.0.0.1:0") as pub:
        env = dict(os.environ)
        proc = subprocess.Popen([sys.executable, "-c", CONSUMER, pub.address], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        lines = []
        for v in range(1, 4):
            # Publish the next version only once the consumer has the previous one live.
            pub.publish({"x": np.full(1 << 16, v, dtype=np.int64)}, step=v)
            lines.append(proc.stdout.readline().split())
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    assert [int(l[0]) for l in lines] == [1, 2, 3], (lines, err)
    assert [int(l[1]) for l in lines] == [v * (1 << 16) for v in (1, 2, 3)]
    assert all(l[2] == "map" for l in lines)


def _free_loopback_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_subscriber_takes_versions_from_its_alternate_and_returns_to_its_node():
    preferred = _free_loopback_address()  # nothing listens there yet
    with viper.Publisher("m", listen="127.0.0.1:0", mode="sync") as alternate:
        alternate.publish({"x": np.full(8, 1, dtype=np.int64)}, step=1)
        with viper.Subscriber("m", connect=preferred, alternates=[alternate.address], preferred_probe=0.2) as sub:
            assert int(sub.wait_for(1, timeout=30)["x"][0]) == 1  # from the alternate
            assert sub.stats()["preferred_returns"] == 0
            with viper.Publisher("m", listen=preferred, mode="sync") as back:
                for step in (1, 2, 3):
                    back.publish({"x": np.full(8, 100 + step, dtype=np.int64)}, step=step)
                version = sub.wait_for(3, timeout=30)  # the node it prefers, once it answers
                assert int(version["x"][0]) == 103
                assert sub.stats()["preferred_returns"] == 1
    with pytest.raises(ValueError, match=r"alternates\[1\]='nowhere'"):
        viper.Subscriber("m", connect=preferred, alternates=[preferred, "nowhere"])


def test_errors_map_to_builtin_exceptions(tmp_path):
    with pytest.raises(OSError) as refused:  # nothing listens there
        viper.Subscriber("m", connect="127.0.0.1:1", request_timeout=2)
    assert isinstance(refused.value, viper.Error)
    with pytest.raises(ValueError):
        viper.Subscriber("m", connect="127.0.0.1:1", path="teleport")
    with pytest.raises(ValueError):
        viper.Publisher("bad/name")
    with pytest.raises(ValueError):
        viper.Publisher("m", mode="eventually")
    with viper.Publisher("m") as pub:
        with pytest.raises(TypeError):
            pub.publish({"x": [1, 2, 3]})
        with pytest.raises(TypeError):
            pub.publish({"x": np.zeros(3, dtype=np.complex64)})
        with pytest.raises(ValueError):
            pub.publish({"x": np.zeros(3, dtype=np.float32)}, **{"viper.version": "9"})
        with viper.Subscriber("m", connect=pub.address) as sub:
            with pytest.raises(TimeoutError) as late:
                sub.wait_for(1, timeout=0.2)
            assert isinstance(late.value, viper.ViperTimeoutError)
            with pytest.raises(LookupError):
                sub.load_into(torch.nn.Linear(1, 1))
    with pytest.raises(viper.Error, match="closed"):
        pub.publish({"x": np.zeros(1, dtype=np.float32)})
    corrupt = tmp_path / "bad.safetensors"
    corrupt.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="header"):
        viper.Snapshot.open(str(corrupt))
    with pytest.raises(FileNotFoundError):
        viper.Snapshot.open(str(tmp_path / "missing.safetensors"))


def test_host_tier_budget_kwargs_refuse_a_publish_beyond_it():
    with viper.Publisher("m", listen="127.0.0.1:0", mode="sync", segment_prefix=f"vpy{os.getpid()}",
                         host_max_bytes=1 << 20, host_max_models=4) as pub:
        pub.publish({"w": np.zeros(1024, dtype=np.float32)})  # 4 kB: within the budget
        with pytest.raises(OSError, match="beyond its budget of 1 MiB"):
            pub.publish({"w": np.zeros(1 << 20, dtype=np.float32)})  # 4 MB
        pub.publish({"w": np.ones(1024, dtype=np.float32)})  # still publishing within it


def test_snapshot_files_round_trip_and_a_flipped_byte_is_caught(tmp_path):
    tensors = {"a": np.arange(12, dtype=np.int16).reshape(3, 4), "s": np.float64(2.5)}
    snap = viper.build_snapshot(tensors, model="m", version=3, step=9, note="hi")
    path = tmp_path / "m.safetensors"
    snap.save(str(path))
    back = viper.Snapshot.open(str(path))
    np.testing.assert_array_equal(back["a"], tensors["a"])
    assert back["s"].shape == () and back["s"] == 2.5
    assert back.metadata["viper.version"] == "3" and back.metadata["note"] == "hi"
    assert back.checksum == snap.checksum
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    with pytest.raises(ValueError, match="checksum"):
        viper.Snapshot.from_bytes(bytes(data))
    assert viper.Snapshot.from_bytes(bytes(data), verify=False)["a"].shape == (3, 4)


def test_blocking_calls_release_the_gil():
    with viper.Publisher("m") as pub, viper.Subscriber("m", connect=pub.address) as sub:
        stop = threading.Event()
        ticks = [0]

        def spin():
            while not stop.is_set():
                ticks[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            sub.wait_for(1, timeout=1.0)  # nothing is published: blocks for the whole second
        elapsed = time.monotonic() - start
        stop.set()
        t.join()
    assert elapsed >= 0.9
    # With the GIL held the spinning thread would not run at all during the wait; released, it
    # runs hundreds of thousands of iterations in that second even on a busy machine.
    assert ticks[0] > 10_000, ticks[0]


def test_ctrl_c_ends_a_blocking_wait_at_once():
    """SIGINT during Subscriber.wait_for / wait: KeyboardInterrupt within a slice (100 ms). Before,
    the handler ran only when the whole timeout had passed (20 s)."""
    script = textwrap.dedent(r"""
        import os, signal, threading, time
        import numpy as np
        import viper
        with viper.Publisher("m", listen="127.0.0.1:0") as pub, viper.Subscriber("m", connect=pub.address) as sub:
            pub.publish({"w": np.ones(4, np.float32)})
            sub.wait_for(1, timeout=30)
            for wait in (lambda: sub.wait_for(2, timeout=20), lambda: sub.wait(timeout=20)):
                threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
                start = time.monotonic()
                try:
                    wait()
                except KeyboardInterrupt:
                    print(f"interrupted after {time.monotonic() - start:.2f} s", flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("interrupted after ") for line in lines), p.stdout
    assert all(float(line.split()[2]) < 5 for line in lines), p.stdout


EXIT_CASES = {
    # a daemon thread inside a viper call at exit: before, "terminate called without an active
    # exception" (SIGABRT), and the publisher's segments stayed
    "daemon thread waiting": """
        def poll():
            while True:
                try:
                    sub.wait_for(2, timeout=0.01)
                except viper.ViperTimeoutError:
                    pass
        threading.Thread(target=poll, daemon=True).start()
        time.sleep(0.3)
    """,
    # a daemon thread running a function of the script: before, __main__'s globals were never
    # cleared, __del__ never ran, and /dev/shm/viper.<pid>.* stayed
    "daemon thread sleeping": """
        threading.Thread(target=lambda: time.sleep(60), daemon=True).start()
    """,
    # a forked child that exits normally: before, it crashed (Node, Publisher: SIGSEGV joining
    # threads that exist only in the parent) or hung (Subscriber), and the parent waited forever
    "forked child": """
        child = os.fork()
        if child == 0:
            sys.exit(0)
        _, status = os.waitpid(child, 0)
        assert status == 0, status
        assert sub.wait_for(1, timeout=10).version == 1  # the parent's objects still work
    """,
}


@pytest.mark.parametrize("case", list(EXIT_CASES))
def test_a_script_ends_cleanly_whatever_is_open_at_exit(case, tmp_path):
    script = textwrap.dedent("""
        import os, sys, threading, time
        import numpy as np
        import viper
        node = viper.Node(listen="127.0.0.1:0")
        pub = viper.Publisher("m", listen="127.0.0.1:0")
        pub.publish({"w": np.ones(1000, np.float32)})
        sub = viper.Subscriber("m", connect=pub.address)
        sub.wait_for(1, timeout=30)
        print(os.getpid(), flush=True)
    """) + textwrap.dedent(EXIT_CASES[case])
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    pid = p.stdout.split()[0]
    left = [f for f in os.listdir("/dev/shm") if f.startswith(f"viper.{pid}.")]
    assert left == [], f"segments left behind: {left}"


def test_close_on_another_thread_during_a_call_ends_the_call_not_the_process():
    """Publisher.close() while another thread publishes, Prefetcher.close() while another thread
    takes batches: the other thread gets "closed" or "Cancelled". Before, the publisher was freed
    under the publishing thread (SIGSEGV in 7 of 8 runs of this script)."""
    script = textwrap.dedent(r"""
        import threading, time
        import numpy as np
        import viper, viper.data as vd
        outcomes = set()
        big = {"w": np.ones(20_000_000, np.float32)}
        for i in range(15):
            pub = viper.Publisher("m", listen="127.0.0.1:0")
            def train():
                try:
                    while True:
                        pub.publish(big)
                except viper.Error as e:
                    outcomes.add(str(e))
            t = threading.Thread(target=train)
            t.start()
            time.sleep(0.2)
            pub.close()
            t.join()
        source = vd.callable_source(lambda i: bytes(4096), [4096] * 400)
        for i in range(40):
            p = vd.Prefetcher(source, epochs=0)
            def consume():
                try:
                    while True:
                        p.next_batch(8)
                except viper.Error as e:
                    outcomes.add(str(e))
            t = threading.Thread(target=consume)
            t.start()
            time.sleep(0.02 + 0.002 * i)
            p.close()
            t.join()
        print("\n".join(sorted(outcomes)))
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    for line in p.stdout.splitlines():
        assert "is closed" in line or "Cancelled" in line, p.stdout


def test_options_are_keywords_of_one_table(tmp_path):
    # Node and Publisher share the node's keywords (one table in python/src/module.cc); the C++
    # defaults apply to what is not given, and every class documents its keywords with them.
    for cls in (viper.Node, viper.Publisher, viper.Subscriber):
        assert "keep_host_versions (2)" in cls.__doc__ or cls is viper.Subscriber
        assert "chunk_bytes (4194304)" in cls.__doc__
    with pytest.raises(TypeError, match="unexpected keyword argument 'keep_host_version'"):
        viper.Node(keep_host_version=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'buffer'"):
        viper.Subscriber("m", buffer=3)
    with pytest.raises(ValueError, match=r"keep_host_versions=-1: must be an int from 0 to 18446744073709551615"):
        viper.Publisher("m", keep_host_versions=-1)
    with pytest.raises(TypeError, match=r"recover='no': expected a bool"):
        viper.Node(recover="no")
    with pytest.raises(TypeError):
        viper.Node("127.0.0.1:0", "name")  # options are keyword-only
    store = tmp_path / "store"  # a pathlib.Path is a path
    with viper.Publisher("m", mode="sync", store_dir=store, keep_file_versions=1, segment_prefix="vopt") as pub:
        pub.publish({"w": np.ones(4, dtype=np.float32)})
    assert (store / "m" / "1.safetensors").is_file()  # close() flushed it
    with viper.Node(store_dir=store, segment_prefix="vopt2") as node:  # recover=True by default
        assert node.latest("m")["version"] == 1


def test_handles_close_once_and_work_as_context_managers():
    pub = viper.Publisher("m")
    address = pub.address
    with viper.Subscriber("m", connect=address) as sub:
        assert sub.latest() is None
    with pytest.raises(viper.Error, match="closed"):
        sub.latest()
    pub.close()
    pub.close()  # idempotent
    node = viper.Node()
    assert node.address.startswith("127.0.0.1:")
    assert node.versions() == []
    node.close()
