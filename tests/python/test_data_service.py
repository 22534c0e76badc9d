"""The data service of a node (python/viper/_data_service.py; DataLoader(service=...),
ServiceControl, `viper data`): a real service process (`python3 -m viper.data_service serve`) and
real training processes attached to it over loopback. Four jobs share one cache (the service's
shared memory is what one job alone needs), samples arrive mapped from that shared memory, a budget
changed at run time moves the readers and the bytes read ahead, per-job stats add up to the
cache's, a job killed mid-epoch leaves the service serving, bad budgets are refused in one line.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_data_service.py
"""
import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import viper
import viper.data as vd
from helpers import free_port, id_sample_tree, wait_until

N, WIDTH = 192, 8192  # samples of WIDTH float32 values (32 KiB), all equal to the sample's id
DATA_BYTES = N * WIDTH * 4
BUILD = os.environ.get("VIPER_BINARY_DIR") or os.path.join(os.path.dirname(vd.__file__), "..", "..")
VIPER = os.path.join(BUILD, "bin", "viper")

JOB = textwrap.dedent(r"""
    import json, os, sys, time
    import numpy as np
    import viper.data as vd
    service, job, seed, epochs, workdir = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    loader = vd.DataLoader(None, batch_size=16, seed=seed, service=service, service_job=job)
    out = {"epochs": []}
    for epoch in range(epochs):
        ids = []
        for x, y in loader:
            v = x.numpy().view(np.float32).reshape(len(x), -1)
            assert (v == v[:, :1]).all(), "a sample's bytes are its id"
            assert (y.numpy() == v[:, 0].astype(np.int64) % 4).all(), "labels"
            ids += [int(i) for i in v[:, 0]]
        out["epochs"].append(ids)
    st = loader.stats()
    out["client"] = {k: st[k] for k in ("wait_seconds", "mapped_samples", "inline_samples", "source_bytes")}
    open(os.path.join(workdir, f"done.{job}"), "w").close()
    # Stay attached until told, so that the service's memory is measured with every job on it.
    while not os.path.exists(os.path.join(workdir, "release")):
        time.sleep(0.01)
    loader.close()
    print(json.dumps(out), flush=True)
""")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return id_sample_tree(tmp_path_factory.mktemp("tree"), N, WIDTH)


class Service:
    """`python3 -m viper.data_service serve` in its own process."""

    def __init__(self, tree, *extra):
        self.address = f"127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen([sys.executable, "-m", "viper.data_service", "serve", str(tree), "--listen",
                                      self.address, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("listening on"), (line, self.proc.stderr.read() if self.proc.poll() is not None else "")

    def control(self):
        return vd.ServiceControl(self.address)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        left = glob.glob(f"/dev/shm/vcache.{self.proc.pid}.*")
        assert left == [], f"the service left segments behind: {left}"


def run_jobs(service, tree, tmp_path, jobs, epochs=2):
    workdir = tmp_path / f"w{jobs}"
    workdir.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", JOB, service.address, f"hp{j}", str(100 + j), str(epochs),
                               str(workdir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for j in range(jobs)]

    def finished():
        if len(glob.glob(str(workdir / "done.*"))) >= jobs:
            return True
        for p in procs:
            if p.poll() is not None and p.returncode != 0:
                pytest.fail(f"a job failed: {p.stderr.read()}")
        return False

    wait_until(finished, 120, "jobs did not finish", interval=0.05)
    with service.control() as ctl:
        stats = ctl.stats()
        jobs_now = ctl.jobs()
    (workdir / "release").touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs, stats, jobs_now


def test_four_jobs_share_one_cache_and_receive_samples_mapped(tree, tmp_path):
    alone_svc = Service(tree)
    try:
        alone, alone_stats, _ = run_jobs(alone_svc, tree, tmp_path, 1)
    finally:
        alone_svc.stop()
    four_svc = Service(tree)
    try:
        four, four_stats, jobs_now = run_jobs(four_svc, tree, tmp_path, 4)
    finally:
        four_svc.stop()
    assert len(jobs_now) == 4 and all(len(j["streams"]) == 1 for j in jobs_now)
    for out in alone + four:
        for ids in out["epochs"]:
            assert sorted(ids) == list(range(N)), "every sample once per epoch"
        # Zero-copy: every sample was mapped from the service's shared memory, none sent inline.
        assert out["client"]["mapped_samples"] == 2 * N and out["client"]["inline_samples"] == 0, out["client"]
    one_shm, four_shm = alone_stats["cache"]["node_bytes"], four_stats["cache"]["node_bytes"]
    one_mem = one_shm + alone_stats["rss_anon_bytes"]
    four_mem = four_shm + four_stats["rss_anon_bytes"]
    one_src, four_src = alone_stats["total"]["source_bytes"], four_stats["total"]["source_bytes"]
    print(f"\nservice memory: one job {one_shm} B shm + {alone_stats['rss_anon_bytes']} B anon; four jobs "
          f"{four_shm} B shm + {four_stats['rss_anon_bytes']} B anon: {four_mem / one_mem:.3f}x "
          f"(shm {four_shm / one_shm:.3f}x); source bytes: one job {one_src}, four jobs {four_src} "
          f"({four_src / DATA_BYTES:.3f}x the data set; four independent loaders read 4x)")
    assert one_shm >= DATA_BYTES, "the data set is cached once"
    assert four_shm <= 1.2 * one_shm
    assert four_mem <= 1.2 * one_mem
    assert one_src == DATA_BYTES, "one job reads the source once, in its first epoch"
    assert four_src == DATA_BYTES, "four jobs read the source once between them (reads of one sample merged)"


def test_budget_changed_at_run_time_moves_readers_and_memory(tree):
    svc = Service(tree, "--job-readers", "4", "--job-memory", str(4 << 20))
    try:
        loader = vd.DataLoader(None, batch_size=8, service=svc.address, service_job="search-a", autotune=False,
                               readers=4, buffer_samples=4096)
        it = iter(loader)
        next(it)
        ctl = svc.control()

        def job():
            (j,) = ctl.jobs()
            return j

        deadline = time.time() + 20
        while job()["buffered_bytes"] < (3 << 20) and time.time() < deadline:
            time.sleep(0.02)  # the readers fill the 4 MiB read-ahead while this consumer sleeps
        before = job()
        assert before["readers"] == 4 and before["budget"] == {"readers": 4, "memory": 4 << 20}
        assert (3 << 20) <= before["buffered_bytes"] <= (4 << 20), before
        assert ctl.set_budget("search-a", readers=1, memory=1 << 20) == {"job": "search-a", "readers": 1,
                                                                        "memory": 1 << 20}
        for _ in range(16):  # take what was read ahead: no new read is claimed beyond 1 MiB
            next(it)
        after = job()
        assert after["readers"] == 1 and after["budget"] == {"readers": 1, "memory": 1 << 20}
        assert after["buffered_bytes"] <= 1 << 20, after
        ctl.set_budget("search-a", readers=3)
        assert job()["readers"] == 3
        print(f"\nbudget 4 readers / 4 MiB: {before['readers']} readers, {before['buffered_bytes']} B read ahead; "
              f"1 reader / 1 MiB: {after['readers']} reader, {after['buffered_bytes']} B; then 3 readers: "
              f"{job()['readers']}")
        st = loader.stats()
        assert st["service"]["budget"] == {"readers": 3, "memory": 1 << 20}
        loader.close()
        ctl.close()
    finally:
        svc.stop()


def test_stats_per_job_add_up_to_the_cache(tree):
    svc = Service(tree)
    try:
        a = vd.DataLoader(None, batch_size=32, seed=1, service=svc.address, service_job="a")
        for _ in range(2):
            for _ in a:
                pass
        b = vd.DataLoader(None, batch_size=32, seed=2, service=svc.address, service_job="b")  # after a filled the cache
        for _ in range(2):
            for _ in b:
                pass
        with svc.control() as ctl:
            st = ctl.stats()
        ja, jb, cache = st["jobs"]["a"], st["jobs"]["b"], st["cache"]
        for j in (ja, jb):
            assert j["delivered"] == 2 * N and j["delivered_bytes"] == 2 * DATA_BYTES
            assert j["wait_seconds"] >= 0 and j["inline_samples"] == 0
        assert ja["source_bytes"] + jb["source_bytes"] == cache["source_bytes"] == st["total"]["source_bytes"]
        assert ja["source_reads"] + jb["source_reads"] == cache["source_reads"]
        assert ja["cache_hits"] + jb["cache_hits"] == cache["local_hits"]
        assert cache["source_bytes"] == DATA_BYTES, "a read the source in its first epoch, once"
        assert jb["source_bytes"] == 0 and jb["cache_hits"] >= 2 * N
        assert a.stats()["source_bytes"] == ja["source_bytes"]
        a.close()
        b.close()
        with svc.control() as ctl:  # jobs that ended still count in the totals
            st2 = ctl.stats()
        assert st2["jobs"] == {} and st2["total"]["source_bytes"] == cache["source_bytes"]
        assert sorted(e["job"] for e in st2["ended_jobs"]) == ["a", "b"]
    finally:
        svc.stop()


def test_a_job_killed_mid_epoch_does_not_take_the_service_down(tree, tmp_path):
    svc = Service(tree)
    try:
        script = textwrap.dedent(r"""
            import sys, time
            import viper.data as vd
            loader = vd.DataLoader(None, batch_size=4, service=sys.argv[1], service_job="doomed", transform=lambda a, l: (a, l),
                                   collate_fn=lambda items: items)
            it = iter(loader)
            held = [next(it) for _ in range(5)]  # per-sample arrays: views pinned in the service's memory
            print("holding", flush=True)
            time.sleep(600)
        """)
        p = subprocess.Popen([sys.executable, "-c", script, svc.address], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "holding", p.stderr.read() if p.poll() is not None else ""
        with svc.control() as ctl:
            assert [j["job"] for j in ctl.jobs()] == ["doomed"]
        p.kill()
        p.wait()
        with svc.control() as ctl:
            wait_until(lambda: ctl.jobs() == [], 10, lambda: f"the dead job's stream is dropped: jobs {ctl.jobs()}",
                       interval=0.05)
            assert [e["job"] for e in ctl.stats()["ended_jobs"]] == ["doomed"]
        loader = vd.DataLoader(None, batch_size=32, service=svc.address, service_job="next")
        ids = []
        for x, _ in loader:
            ids += [int(i) for i in x.numpy().view(np.float32).reshape(len(x), -1)[:, 0]]
        assert sorted(ids) == list(range(N))
        loader.close()
    finally:
        svc.stop()


def test_bad_arguments_and_budgets_are_refused_in_one_line(tree):
    with pytest.raises(viper.InvalidArgumentError, match=r"DataLoader\(\): service='nowhere': must be 'HOST:PORT'"):
        vd.DataLoader(None, service="nowhere")
    with pytest.raises(TypeError, match=r"service='127.0.0.1:1' and cache_nodes"):
        vd.DataLoader(None, service="127.0.0.1:1", cache_nodes=["127.0.0.1:2"])
    with pytest.raises(TypeError, match=r"max_readers=... is not an option with service="):
        vd.DataLoader(None, service="127.0.0.1:1", max_readers=3)
    with pytest.raises(vd.ServiceError, match=r"service='127.0.0.1:1': cannot connect"):
        vd.DataLoader(None, service="127.0.0.1:1")
    with pytest.raises(viper.InvalidArgumentError, match=r"job_readers=0: must be an int from 1 to 1024"):
        vd.DataService(tree, job_readers=0)
    svc = Service(tree)
    try:
        with svc.control() as ctl:
            with pytest.raises(viper.InvalidArgumentError, match=r"readers=0: must be an int from 1 to 1024"):
                ctl.set_budget("j", readers=0)
            with pytest.raises(viper.InvalidArgumentError, match=r"memory=4096: must be an int from 1048576"):
                ctl.set_budget("j", memory=4096)
            with pytest.raises(TypeError, match=r"readers='8': expected an int"):
                ctl.set_budget("j", readers="8")
            with pytest.raises(viper.InvalidArgumentError, match=r"give readers, memory or both"):
                ctl.set_budget("j")
        # The service checks what arrives over the wire too (a client other than ServiceControl).
        from viper._data_service import _Connection
        conn = _Connection("test", svc.address, "", 5)
        with pytest.raises(vd.ServiceError, match=r"refused: .*readers=-1: must be an int from 1 to 1024"):
            conn.call({"op": "set_budget", "job": "j", "readers": -1}, "test")
        with pytest.raises(vd.ServiceError, match=r"refused: .*op='drop_tables': not a request"):
            conn.call({"op": "drop_tables"}, "test")
        conn.close()
        assert os.path.exists(VIPER), f"{VIPER}: `viper data` is tested here"
        for args, rule in ((["--readers", "0"], "--readers: '0' must be an integer from 1 to 1024"),
                           (["--memory", "12x"], "--memory '12x'"),
                           (["--memory", "4096"], "--memory '4096': must be at least 1MiB")):
            r = subprocess.run([VIPER, "data", "set-budget", "--node", svc.address, "--job", "j", *args],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, (args, r.stderr)
            assert rule in r.stderr, r.stderr
        r = subprocess.run([VIPER, "data", "set-budget", "--node", svc.address, "--job", "j", "--readers", "2",
                            "--memory", "2MiB"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"job": "j", "readers": 2, "memory": 2 << 20}
        r = subprocess.run([VIPER, "data", "stats", "--node", svc.address], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0 and "cache" in json.loads(r.stdout), r.stderr
    finally:
        svc.stop()


def test_a_process_that_exits_without_closing_its_service_and_loader_ends_cleanly(tree):
    """One process runs the service and a loader attached to it and exits without closing either
    (as a short script does): the service is closed at exit, the loader's detach gets its answer,
    and the cache's segments go. Before, the process hung at exit and left its segments."""
    script = textwrap.dedent(r"""
        import sys
        import viper.data as vd
        svc = vd.DataService(sys.argv[1], "127.0.0.1:0")
        loader = vd.DataLoader(None, batch_size=16, seed=1, service=svc.address)
        print(os.getpid(), sum(len(y) for _, y in loader), flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", "import os\n" + script, str(tree)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    pid, samples = p.stdout.split()
    assert int(samples) == N, p.stdout
    left = glob.glob(f"/dev/shm/vcache.{pid}.*")
    assert left == [], f"segments left behind: {left[:5]}"


def test_a_connection_that_never_proves_the_token_is_dropped_and_a_silent_service_is_refused(tree, monkeypatch):
    """A stranger that connects and says nothing holds one of the service's threads only for the
    handshake time (before, forever); a client that authenticated may idle past it. A client whose
    "service" accepts and says nothing fails within its timeout (before, it waited forever)."""
    import socket
    from viper import _data_service
    monkeypatch.setattr(_data_service, "HANDSHAKE_SECONDS", 0.5)
    svc = vd.DataService(tree, "127.0.0.1:0", token="s3cret")
    try:
        host, port = svc.address.rsplit(":", 1)
        with vd.ServiceControl(svc.address, token="s3cret") as ctl:
            stranger = socket.create_connection((host, int(port)), timeout=30)
            greeting = _data_service._recv(stranger, 4096, 0)[0]
            assert greeting["service"] == "viper-data"
            start = time.monotonic()
            assert stranger.recv(1) == b"", "the service closes a connection that sent nothing"
            assert time.monotonic() - start < 10
            stranger.close()
            time.sleep(1.0)  # the authenticated connection idles past the handshake time
            assert ctl.set_budget("j", readers=2) == {"job": "j", "readers": 2, "memory": 64 << 20}
    finally:
        svc.close()

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        start = time.monotonic()
        with pytest.raises(vd.ServiceError, match=r"not a viper data service \(timed out\)"):
            vd.ServiceControl("127.0.0.1:%d" % silent.getsockname()[1], timeout=0.5)
        assert time.monotonic() - start < 10
    finally:
        silent.close()


class FakeService:
    """A stranger on a port that speaks the service's greeting and answers `hello` as told
    (`proof`: what it puts there, None for nothing), recording every request it gets after that."""

    def __init__(self, proof):
        import socket
        from viper import _data_service
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.after_hello = []

        def serve():
            while True:
                try:
                    conn, _ = self.listener.accept()
                except OSError:
                    return
                with conn:
                    try:
                        _data_service._send(conn, {"service": "viper-data", "protocol": _data_service.PROTOCOL,
                                                   "nonce": "00" * 16})
                        _data_service._recv(conn, 4096, 0)
                        reply = {"ok": True, "node": "127.0.0.1:1", "pid": 1, "samples": N}
                        if proof is not None:
                            reply["proof"] = proof
                        _data_service._send(conn, reply)
                        self.after_hello.append(_data_service._recv(conn, 16 << 20, 0)[0])
                    except (OSError, ConnectionError):
                        pass

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def close(self):
        self.listener.close()


def test_the_token_is_proven_both_ways_and_a_stranger_on_the_port_gets_nothing(tree, tmp_path):
    """With a token, the client proves it to the service and the service proves it to the client,
    neither sending it. A client refuses a "service" that cannot prove it (a stranger that took the
    port, or a service with another token or none) before sending it any request; before, it
    attached to whatever answered and took its samples (and segment names) as the service's."""
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    token_file.chmod(0o600)
    svc = Service(tree, "--token-file", str(token_file))
    try:
        with vd.ServiceControl(svc.address, token="s3cret") as ctl:
            assert ctl.set_budget("j", readers=2)["readers"] == 2
        loader = vd.DataLoader(None, batch_size=16, seed=1, service=svc.address, service_token="s3cret")
        assert sum(len(y) for _, y in loader) == N
        loader.close()
        with pytest.raises(vd.ServiceError, match=r"refused: unauthenticated: wrong or missing token"):
            vd.ServiceControl(svc.address, token="wrong")
        with pytest.raises(vd.ServiceError, match=r"refused: unauthenticated: wrong or missing token"):
            vd.ServiceControl(svc.address)
        r = subprocess.run([VIPER, "data", "jobs", "--node", svc.address, "--token-file", str(token_file)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and isinstance(json.loads(r.stdout), list), r.stderr
        wrong = tmp_path / "wrong"
        wrong.write_text("not-it\n")
        wrong.chmod(0o600)
        r = subprocess.run([VIPER, "data", "jobs", "--node", svc.address, "--token-file", str(wrong)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "unauthenticated" in r.stderr, (r.returncode, r.stderr)  # as a node's: not 2
    finally:
        svc.stop()

    untokened = Service(tree)
    try:  # a service without a token proves nothing: a client that has one does not trust it
        with pytest.raises(vd.ServiceError, match=r"did not prove that it holds the token"):
            vd.ServiceControl(untokened.address, token="s3cret")
    finally:
        untokened.stop()

    # The Python commands read a token file by the viper command's rule: owner-only, one line.
    token_file.chmod(0o644)
    many = tmp_path / "two-lines"
    many.write_text("one\ntwo\n")
    many.chmod(0o600)
    for module, path, rule in (("viper.data_service", token_file, "has mode 0644: group or others may access it"),
                               ("viper.neardata", many, "holds more than one line; a token is one line")):
        args = ["jobs", "--node", "127.0.0.1:1"] if module == "viper.data_service" else \
            ["serve", "--model", "m", "--factory", "x:y", "--data", "d", "--labels", "l", "--connect", "127.0.0.1:1"]
        r = subprocess.run([sys.executable, "-m", module, *args, "--token-file", str(path)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and rule in r.stderr and r.stderr.count("\n") == 1, (module, r.stderr)
    token_file.chmod(0o600)

    for proof in (None, "ab" * 32, "not hex"):
        fake = FakeService(proof)
        try:
            with pytest.raises(vd.ServiceError, match=r"did not prove that it holds the token: not the service meant"):
                vd.DataLoader(None, batch_size=16, service=fake.address, service_token="s3cret")
            r = subprocess.run([VIPER, "data", "set-budget", "--node", fake.address, "--job", "j", "--readers", "2",
                                "--token-file", str(token_file)], capture_output=True, text=True, timeout=30)
            assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
            assert "did not prove that it holds the token" in r.stderr, r.stderr
            time.sleep(0.2)  # a request sent after hello would have reached the fake by now
            assert fake.after_hello == [], f"sent to a stranger: {fake.after_hello}"
        finally:
            fake.close()


def _frame(obj, blob_bytes=0):
    import struct
    data = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
    return struct.pack(">II", len(data), blob_bytes) + data


def _closed_without_reply(sock):
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_stranger_cannot_make_the_service_read_more_than_a_hello(tree, capsys):
    """Before it proves the token, a connection's first frame may hold a hello and nothing more:
    before, the service read any frame of up to 16 MiB of JSON and 1 GiB of blob into memory from
    anyone who connected (a few connections could take a node's memory). A frame over the limit is
    refused from its header, none of its bytes read; after the proof, requests carry no blob, and
    malformed numbers get an error reply instead of a traceback in the service's log."""
    import socket
    from viper import _data_service
    svc = vd.DataService(tree, "127.0.0.1:0", token="s3cret")
    host, port = svc.address.rsplit(":", 1)
    try:
        # A header announcing a 1 GiB blob: the service closes at once, so a sender pushing the
        # bytes is reset long before 256 MiB (the old service read them all, buffering 1 GiB).
        with socket.create_connection((host, int(port)), timeout=30) as s:
            _data_service._recv(s, 4096, 0)  # its hello
            s.sendall(_frame({"op": "hello"}, 1 << 30))
            chunk, sent = bytes(4 << 20), 0
            with pytest.raises((BrokenPipeError, ConnectionResetError)):
                while sent < 256 << 20:
                    s.sendall(chunk)
                    sent += len(chunk)
        # A well-formed hello of 5,000 bytes: over the 4 KiB a hello may take, so no reply at all
        # (the old service parsed it and answered "unauthenticated").
        with socket.create_connection((host, int(port)), timeout=30) as s:
            _data_service._recv(s, 4096, 0)
            s.sendall(_frame({"op": "hello", "auth": "x" * 5000}))
            assert _closed_without_reply(s)
        # Proven, then a request with a blob: refused from its header too.
        with socket.create_connection((host, int(port)), timeout=30) as s:
            hello, _ = _data_service._recv(s, 4096, 0)
            _data_service._send(s, {"op": "hello", "auth": _data_service._client_proof("s3cret", hello["nonce"]),
                                    "nonce": "ab"})
            assert _data_service._recv(s, 4096, 0)[0]["ok"]
            for bad, why in (({"op": "next", "stream": 1e400}, "stream=inf"),
                             ({"op": "next", "stream": 1, "release": "12"}, "release='12'"),
                             ({"op": "next", "stream": 1, "release": [1.5]}, "pin=1.5"),
                             ({"op": "detach", "stream": "1"}, "stream='1'")):
                _data_service._send(s, bad)
                reply, _ = _data_service._recv(s, 1 << 20, 0)
                assert why in reply.get("error", ""), (bad, reply)
            s.sendall(_frame(b"[" * 100000 + b"]" * 100000))  # nested past Python's recursion limit
            assert _closed_without_reply(s)
        with socket.create_connection((host, int(port)), timeout=30) as s:
            hello, _ = _data_service._recv(s, 4096, 0)
            _data_service._send(s, {"op": "hello", "auth": _data_service._client_proof("s3cret", hello["nonce"])})
            _data_service._recv(s, 4096, 0)
            s.sendall(_frame({"op": "jobs"}, 1))
            assert _closed_without_reply(s)
        # The service still serves; a client's request over the limit is refused before it is sent,
        # with the reason, and its connection stays usable.
        with vd.ServiceControl(svc.address, token="s3cret") as ctl:
            assert ctl.jobs() == []
        with pytest.raises(ValueError, match=r"over the data service's limit of 16777216 \(an attach with fewer ids\)"):
            _data_service.ServiceStream(svc.address, job="j", token="s3cret", ids=range(3_000_000))
        stream = _data_service.ServiceStream(svc.address, job="j", token="s3cret", ids=range(8))
        assert sorted(int(i) for i in stream.next_batch(8)[2]) == list(range(8))
        stream.close()
    finally:
        svc.close()
    assert "Traceback" not in capsys.readouterr().err, "every bad frame is handled, none escapes as a traceback"

    # The other way: a "service" whose greeting announces 1 GiB is refused from the header.
    liar = socket.create_server(("127.0.0.1", 0))

    def greet():
        conn, _ = liar.accept()
        with conn:
            conn.sendall(_frame({"service": "viper-data"}, 1 << 30))
            _closed_without_reply(conn)  # the client hangs up (a reset: it read nothing more)

    t = threading.Thread(target=greet, daemon=True)
    t.start()
    with pytest.raises(vd.ServiceError, match=r"not a viper data service \(frame of 25 \+ 1073741824 bytes is over"):
        vd.ServiceControl("127.0.0.1:%d" % liar.getsockname()[1], timeout=10)
    t.join(10)
    liar.close()


def test_a_request_cut_short_leaves_the_connection_refusing_instead_of_out_of_step(tree, monkeypatch):
    """A KeyboardInterrupt between a request and its reply: before, the next call on that
    connection read the old reply (DataLoader.stats() raised KeyError: 'stats'); now it says the
    connection was cut, and a closed stream says it is closed (it raised AttributeError)."""
    from viper import _data_service
    svc = vd.DataService(tree, "127.0.0.1:0")
    try:
        conn = _data_service._Connection("test", svc.address, "", 5)
        real = _data_service._recv

        caller = threading.current_thread()

        def interrupted(*args):  # the client's read only: the in-process service shares the module
            if threading.current_thread() is not caller:
                return real(*args)
            raise KeyboardInterrupt

        monkeypatch.setattr(_data_service, "_recv", interrupted)
        with pytest.raises(KeyboardInterrupt):
            conn.call({"op": "jobs"}, "test")
        monkeypatch.setattr(_data_service, "_recv", real)
        with pytest.raises(vd.ServiceError, match=r"cut mid-request \(KeyboardInterrupt\); open a new one"):
            conn.call({"op": "stats"}, "test")
        stream = _data_service.ServiceStream(svc.address, job="j")
        stream.close()
        with pytest.raises(vd.ServiceError, match="the stream from the data service is closed"):
            stream.next_batch(4)
    finally:
        svc.close()


def test_a_forked_child_leaves_the_parents_service_alone(tree):
    """A child forked while the service runs and exiting normally: before, it hung at exit in the
    service's close (waiting for a server thread that exists only in the parent), and would then
    have cut the parent's client connections."""
    script = textwrap.dedent(r"""
        import os, sys
        import viper.data as vd
        svc = vd.DataService(sys.argv[1], "127.0.0.1:0")
        loader = vd.DataLoader(None, batch_size=16, seed=1, service=svc.address)
        it = iter(loader)
        next(it)
        child = os.fork()
        if child == 0:
            sys.exit(0)
        _, status = os.waitpid(child, 0)
        print(status, 16 + sum(len(y) for _, y in it), flush=True)  # the parent's connection still serves
    """)
    p = subprocess.run([sys.executable, "-c", script, str(tree)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["0", str(N)], p.stdout
