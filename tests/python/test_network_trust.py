"""The network half of the threat model (docs/RELIABILITY.md), with real processes: a `viper serve`
node, the `viper` CLI as its client, raw TCP connections as the stranger who can reach the port,
and a real redis-server as the registry a stranger may write to.

- Thousands of idle or slow unauthenticated connections do not lock a token-holding client out.
- The token never crosses the wire (challenge-response): a fake listener learns nothing from it.
- A refused client is told why; a consumer whose registry holder does not answer tries the next.
- Redis AUTH from a password file, with a secret file's hygiene.
- The stop reads `--address-file` without blocking on whatever was put at its path.
"""
import json
import os
import resource
import socket
import struct
import subprocess
import tempfile
import threading
import time

import pytest
from helpers import free_port, wait_until

REDIS = "/usr/bin/redis-server"
BIN = os.path.join(os.environ.get("VIPER_BINARY_DIR", os.path.join(os.path.dirname(__file__), "../../build")),
                   "bin", "viper")
TOKEN = "fleet-token-0123456789abcdef0123456789abcdef"


def secret_file(directory, name, text, mode=0o600):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def tiny_safetensors(path, value):
    data = struct.pack("<4f", value, value, value, value)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)


def viper(*args, timeout=60):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


class Serve:
    """`viper serve` on a free loopback port; its address from --address-file."""

    def __init__(self, work, token_file=None, extra=()):
        self.address_file = os.path.join(work, f"addr-{time.monotonic_ns()}")
        argv = [BIN, "serve", "--listen", "127.0.0.1:0", "--address-file", self.address_file, *extra]
        if token_file:
            argv += ["--token-file", token_file]
        self.log = open(os.path.join(work, f"serve-{time.monotonic_ns()}.log"), "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(self.started, 30, "viper serve did not start", interval=0.05)
        with open(self.address_file) as f:
            self.address = f.read().strip()
        self.port = int(self.address.rsplit(":", 1)[1])

    def started(self):
        if os.path.exists(self.address_file):
            return True
        assert self.proc.poll() is None, "viper serve exited"
        return False

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def work():
    with tempfile.TemporaryDirectory() as d:
        yield d


def timed_ls(address, token_file):
    t0 = time.monotonic()
    r = viper("ls", "--connect", address, "--token-file", token_file)
    return time.monotonic() - t0, r


def stats_of(address, token_file):
    r = viper("stats", "--connect", address, "--token-file", token_file, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_idle_and_slow_connections_do_not_lock_clients_out(work):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    idle_count = min(2000, hard - 200)
    slow_count = 50
    token_file = secret_file(work, "token", TOKEN)
    node = Serve(work, token_file)
    idle, slow = [], []
    stop = threading.Event()
    try:
        baseline = sorted(timed_ls(node.address, token_file)[0] for _ in range(5))
        for i in range(idle_count):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", node.port))
            idle.append(s)
        for i in range(slow_count):
            s = socket.create_connection(("127.0.0.1", node.port))
            slow.append(s)

        def loris():  # one byte a second of a well-formed HELLO, on every slow connection
            hello = b"VIPB" + struct.pack("<HBBI", 3, 1, 1, 32) + bytes(32)
            i = 0
            while not stop.wait(1.0):
                for s in slow:
                    try:
                        s.send(hello[i % len(hello):i % len(hello) + 1])
                    except OSError:
                        pass
                i += 1

        t = threading.Thread(target=loris, daemon=True)
        t.start()
        time.sleep(1.0)  # the flood is in place
        flooded, failures = [], []
        for _ in range(10):  # over ~4 s: past the node's 2 s first-frame deadline
            seconds, r = timed_ls(node.address, token_file)
            flooded.append(seconds)
            if r.returncode != 0:
                failures.append(r.stderr)
            time.sleep(0.3)
        stop.set()
        t.join()
        # The last pending ones reach their 2 s deadline: wait until every flood connection is counted.
        deadline = time.monotonic() + 15
        while True:
            stats = stats_of(node.address, token_file)
            refused = stats["handshakes_evicted"] + stats["handshakes_timed_out"]
            if refused >= idle_count + slow_count or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        flooded.sort()
        print(f"\nFLOOD: {idle_count} idle + {slow_count} slow-loris connections; viper ls median "
              f"{baseline[2] * 1000:.0f} ms without, {flooded[5] * 1000:.0f} ms with (max {flooded[-1] * 1000:.0f} ms); "
              f"peers_refused {stats['peers_refused']}, evicted {stats['handshakes_evicted']}, "
              f"timed out {stats['handshakes_timed_out']}")
        assert not failures, failures
        # The client's own connect timeout is 5 s; before the fix 100 idle connections cost 4 s
        # each call. The median holds the bound; the slowest call, which one descheduled moment on
        # a loaded machine can stretch, must still be short of what the old acceptor took.
        assert flooded[len(flooded) // 2] < 2.5, flooded
        assert flooded[-1] < 3.5, flooded
        # Every flood connection was refused: evicted by newer ones beyond the per-address cap
        # (128), the rest closed at the first-frame deadline; all counted.
        assert stats["handshakes_evicted"] + stats["handshakes_timed_out"] >= idle_count + slow_count, stats
        assert stats["handshakes_timed_out"] >= 1, stats
        assert stats["peers_refused"] >= idle_count + slow_count, stats
    finally:
        stop.set()
        for s in idle + slow:
            s.close()
        node.stop()
    with open(node.log.name) as f:
        log = f.read()
    assert "refused connection from 127.0.0.1:" in log, log[-2000:]
    assert "not logged in the last" in log or log.count("refused connection from") <= 40, log[-2000:]
    assert log.count("refused connection from") <= 200, "the log is rate-limited"


class FakeListener:
    """A plain TCP server that records every byte a client sends; `answer(first_bytes)` returns
    what it sends back after the client's first 44 bytes (a HELLO), or None to stay silent."""

    def __init__(self, answer):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.received = b""
        self.answer = answer
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        conn, _ = self.sock.accept()
        conn.settimeout(5)
        try:
            while len(self.received) < 44:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                self.received += chunk
            reply = self.answer(self.received)
            if reply is not None:
                conn.sendall(reply)
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                self.received += chunk
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.thread.join(10)
        self.sock.close()


def challenge(with_proof):
    body = os.urandom(32) + (os.urandom(32) if with_proof else b"")
    return b"VIPB" + struct.pack("<HBBI", 3, 2, 1 if with_proof else 0, len(body)) + body


@pytest.mark.parametrize("answer", ["silent", "challenge with a forged proof", "challenge without proof"])
def test_a_fake_listener_never_sees_the_token(work, answer):
    token_file = secret_file(work, "token", TOKEN)
    replies = {"silent": lambda _: None,
               "challenge with a forged proof": lambda _: challenge(True),
               "challenge without proof": lambda _: challenge(False)}
    fake = FakeListener(replies[answer])
    r = viper("ls", "--connect", f"127.0.0.1:{fake.port}", "--token-file", token_file, timeout=30)
    fake.close()
    assert r.returncode != 0
    sent = fake.received
    # A HELLO: header and a fresh 32-byte nonce, nothing derived from the token; then, refusing a
    # node that could not prove the token, a 13-byte RESULT. Nothing else.
    assert sent[:4] == b"VIPB" and sent[4:8] == struct.pack("<HBB", 3, 1, 1), sent[:12]
    assert len(sent) == (44 if answer == "silent" else 44 + 13), (len(sent), sent)
    assert TOKEN.encode() not in sent
    if answer != "silent":
        assert sent[44:] in (b"VIPB" + struct.pack("<HBBI", 3, 4, 0, 1) + b"\x01",
                             b"VIPB" + struct.pack("<HBBI", 3, 4, 0, 1) + b"\x02"), sent[44:]
        assert "PermissionDenied" in r.stderr or "token" in r.stderr, r.stderr


def read_frame(s):
    head = b""
    while len(head) < 12:
        chunk = s.recv(12 - len(head))
        assert chunk, f"closed after {len(head)} header bytes"
        head += chunk
    assert head[:4] == b"VIPB", head
    version, kind, flags, length = struct.unpack("<HBBI", head[4:])
    body = b""
    while len(body) < length:
        chunk = s.recv(length - len(body))
        assert chunk, "closed inside a frame"
        body += chunk
    return version, kind, flags, body


def test_a_stranger_never_learns_the_nodes_worker_address(work):
    # UCX matches tagged messages from any endpoint, even one that never proved the token: whoever
    # has the node's worker address can queue bytes on it. So a node with a token shows it only to
    # a client that proved the token: the CHALLENGE is a nonce and the node's proof, nothing else,
    # and a PROOF without the right MAC is answered with a bare refusal.
    token_file = secret_file(work, "token", TOKEN)
    node = Serve(work, token_file)
    try:
        with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
            s.sendall(b"VIPB" + struct.pack("<HBBI", 3, 1, 1, 32) + os.urandom(32))
            version, kind, flags, body = read_frame(s)
            assert (version, kind, flags, len(body)) == (3, 2, 1, 64), (version, kind, flags, len(body))
            address = bytes(range(1, 200))  # never reaches UCX: the proof is checked first
            proof = os.urandom(32) + address
            s.sendall(b"VIPB" + struct.pack("<HBBI", 3, 3, 1, len(proof)) + proof)
            version, kind, flags, body = read_frame(s)
            assert (kind, flags, body) == (4, 0, b"\x02"), (kind, flags, body)
        # The client with the token still gets in (and so is given the address).
        r = viper("ls", "--connect", node.address, "--token-file", token_file)
        assert r.returncode == 0, r.stderr
    finally:
        node.stop()


def test_an_accepted_result_without_the_address_proof_is_refused(work):
    # A node's worker address comes in the accepted RESULT, bound to the session by an HMAC of the
    # token: someone between the client and its node (here a listener that knows the token's proof
    # for the CHALLENGE but not for the address it hands out) cannot point the client elsewhere.
    import hashlib
    import hmac
    token_file = secret_file(work, "token", TOKEN)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    seen = {}

    def serve():
        conn, _ = listener.accept()
        conn.settimeout(10)
        with conn:
            _, _, _, nonce_c = read_frame(conn)
            nonce_n = os.urandom(32)
            proof = hmac.new(TOKEN.encode(), b"viper-bootstrap-v3 node" + nonce_c + nonce_n, hashlib.sha256).digest()
            conn.sendall(b"VIPB" + struct.pack("<HBBI", 3, 2, 1, 64) + nonce_n + proof)
            seen["proof"] = read_frame(conn)
            body = b"\x00" + os.urandom(32) + bytes([0x11]) * 40
            conn.sendall(b"VIPB" + struct.pack("<HBBI", 3, 4, 1, len(body)) + body)
            try:
                conn.recv(1)
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    r = viper("ls", "--connect", f"127.0.0.1:{port}", "--token-file", token_file, timeout=30)
    t.join(10)
    listener.close()
    assert seen["proof"][1] == 3, seen  # the node's proof verified: the client sent its PROOF
    assert r.returncode != 0
    assert "does not carry the token's proof" in r.stderr, r.stderr


def test_wrong_or_missing_token_is_refused_and_told(work):
    token_file = secret_file(work, "token", TOKEN)
    wrong_file = secret_file(work, "wrong", "another-token-of-another-fleet")
    node = Serve(work, token_file)
    try:
        r = viper("ls", "--connect", node.address, "--token-file", wrong_file)
        assert r.returncode != 0
        assert "wrong token" in r.stderr and node.address in r.stderr, r.stderr
        env = {k: v for k, v in os.environ.items() if k != "VIPER_TOKEN"}
        r = subprocess.run([BIN, "ls", "--connect", node.address], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode != 0
        assert f"refused by {node.address}: a token is required" in r.stderr, r.stderr
        assert "closed without an answer" not in r.stderr
        stats = stats_of(node.address, token_file)
        assert stats["handshakes_refused_token"] >= 2, stats
        assert stats["peers_refused"] >= 2, stats
    finally:
        node.stop()


@pytest.fixture
def redis_server(work):
    """A redis-server on a free port with --requirepass; yields (url, password)."""
    password = "redis-pass-" + os.urandom(8).hex()
    for _ in range(8):
        port = free_port()
        proc = subprocess.Popen([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                 "--dir", work, "--requirepass", password],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        up = False
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64):
                        up = True
                        break
            except OSError:
                time.sleep(0.02)
        if up:
            break
        proc.kill()
        proc.wait()
    else:
        pytest.fail("redis-server did not start")
    try:
        yield f"redis://127.0.0.1:{port}", password, port
    finally:
        proc.kill()
        proc.wait()


def redis_cli(port, password, *args):
    r = subprocess.run(["redis-cli", "-p", str(port), "--no-auth-warning", "-a", password, *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_redis_auth_from_a_password_file_and_the_next_holder(work, redis_server):
    url, password, redis_port = redis_server
    token_file = secret_file(work, "token", TOKEN)
    pass_file = secret_file(work, "redis-pass", f"  {password}\n")  # whitespace is stripped
    loose = secret_file(work, "loose-pass", password, mode=0o640)
    r = viper("ls", "--registry", url, "--registry-password-file", loose)
    assert r.returncode != 0 and "group or others" in r.stderr, r.stderr
    r = viper("ls", "--registry", url, "--registry-password-file", work)
    assert r.returncode != 0 and "is a directory" in r.stderr, r.stderr
    r = viper("ls", "--registry", url)
    assert r.returncode != 0 and "NOAUTH" in r.stderr and "--registry-password-file" in r.stderr, r.stderr
    wrong = secret_file(work, "wrong-pass", "not-the-password")
    r = viper("ls", "--registry", url, "--registry-password-file", wrong)
    assert r.returncode != 0 and "AUTH refused" in r.stderr and "not-the-password" not in r.stderr, r.stderr

    node = Serve(work, token_file, extra=["--registry", url, "--registry-password-file", pass_file,
                                          "--registry-ttl", "30"])
    try:
        model_file = os.path.join(work, "m.safetensors")
        tiny_safetensors(model_file, 1.5)
        r = viper("publish", "trust", model_file, "--connect", node.address, "--token-file", token_file)
        assert r.returncode == 0, r.stderr
        wait_until(lambda: "trust" in viper("ls", "--registry", url, "--registry-password-file", pass_file).stdout, 20,
                   "the node did not register", interval=0.2)

        # A record of the same version held by a node at a dead port (a node that died: its
        # records linger until their TTL; or a forged record), listed before the real holder (the
        # index lists a version's holders by node id, descending).
        keys = redis_cli(redis_port, password, "KEYS", "viper:rec:trust:*").split()
        assert keys, "no record"
        record = json.loads(redis_cli(redis_port, password, "GET", keys[0]))
        dead = f"127.0.0.1:{free_port()}"
        text = json.dumps(record).replace(node.address, dead)
        forged = json.loads(text)
        node_id = forged["node"]["id"] = "f" * len(record["node"]["id"])
        version = forged["version"]
        redis_cli(redis_port, password, "SET", f"viper:rec:trust:{version}:{node_id}", json.dumps(forged), "PX", "60000")
        redis_cli(redis_port, password, "ZADD", "viper:idx:trust", str(version), f"{version}:{node_id}")
        # A holder counts while its node's liveness key holds the record's pid (a node that died
        # within its TTL, or a forger who writes that key too).
        redis_cli(redis_port, password, "SET", f"viper:node:{node_id}", str(forged["node"]["pid"]), "PX", "60000")
        listed = viper("ls", "--registry", url, "--registry-password-file", pass_file).stdout
        assert dead in listed, listed

        out = os.path.join(work, "pulled.safetensors")
        r = viper("pull", "trust", "-o", out, "--registry", url, "--registry-password-file", pass_file,
                  "--token-file", token_file)
        assert r.returncode == 0, r.stderr
        assert f"holder {dead}" in r.stderr and "trying " + node.address in r.stderr, r.stderr
        with open(out, "rb") as a, open(model_file, "rb") as b:
            assert a.read()[-16:] == b.read()[-16:]

        r = viper("watch", "trust", "--registry", url, "--registry-password-file", pass_file, "--token-file",
                  token_file, "--count", "1", "--timeout", "30", timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "trust v" in r.stdout, r.stdout
        assert f"holder {dead} did not answer" in r.stderr, r.stderr
    finally:
        node.stop()


def test_python_options_take_the_password_file(work, redis_server):
    import viper
    url, password, _ = redis_server
    pass_file = secret_file(work, "redis-pass", password + "\n")
    loose = secret_file(work, "loose-pass", password, mode=0o644)
    with pytest.raises(ValueError, match="group or others"):
        viper.Subscriber("pyauth", registry=url, registry_password_file=loose)
    with pytest.raises(Exception, match="NOAUTH"):
        viper.Subscriber("pyauth", registry=url)
    with viper.Subscriber("pyauth", registry=url, registry_password_file=pass_file) as sub:
        with viper.Publisher("pyauth", mode="sync", registry=url, registry_password_file=pass_file) as pub:
            import numpy as np
            pub.publish({"w": np.arange(8, dtype=np.float32)})
            version = sub.wait_for(1, timeout=30)
            assert version.version == 1
            assert np.array_equal(version["w"], np.arange(8, dtype=np.float32))


def test_the_stop_reads_the_address_file_without_blocking(work):
    # On a clean stop `viper serve` removes its --address-file if it still names the node. What was
    # put at the path since must not hold the stop (and its last flushes) up: a FIFO made an
    # ifstream wait for a writer for ever.
    node = Serve(work)
    os.unlink(node.address_file)
    os.mkfifo(node.address_file)
    node.proc.terminate()
    assert node.proc.wait(20) == 0
    node.log.close()
    assert os.path.exists(node.address_file)  # not ours to remove
    again = Serve(work)
    again.stop()
    assert not os.path.exists(again.address_file)  # a regular file naming the node goes
