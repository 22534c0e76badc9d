"""`viper publish` and `viper pull`: --json (one object on stdout), a progress bar on stderr only
when stderr is a terminal (a real pty), and the exit codes in every command's --help. The real
`viper` binary of this build against a real node (viper.Node in this process)."""
import json
import os
import pathlib
import pty
import re
import select
import subprocess

import numpy as np
import pytest

import viper

BINARY_DIR = pathlib.Path(os.environ.get("VIPER_BINARY_DIR", pathlib.Path(__file__).resolve().parents[2] / "build"))
VIPER = str(BINARY_DIR / "bin" / "viper")


@pytest.fixture(scope="module")
def node():
    with viper.Node("127.0.0.1:0") as n:
        yield n


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "model.safetensors"
    rng = np.random.default_rng(0)
    tensors = {f"layer{i}.weight": rng.standard_normal((512, 1024)).astype(np.float32) for i in range(8)}  # 16 MiB
    viper.build_snapshot(tensors, step=7).save(str(path))
    return path


def run(*args, timeout=60):
    return subprocess.run([VIPER, *args], capture_output=True, text=True, timeout=timeout)


def run_with_stderr_on_a_pty(*args, timeout=60):
    """Runs viper with stdout a pipe and stderr a pty; returns (returncode, stdout, what the pty got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([VIPER, *args], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    got = b""
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            raise AssertionError(f"viper {' '.join(args)}: no output within {timeout} s")
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        got += chunk
    out = proc.stdout.read().decode()
    rc = proc.wait(timeout)
    os.close(master)
    return rc, out, got.decode(errors="replace")


def test_publish_and_pull_print_one_json_object(node, model_file, tmp_path):
    p = run("publish", "cli-json", str(model_file), "--step", "7", "--connect", node.address, "--json")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # not a terminal: no progress
    published = json.loads(p.stdout)  # the whole of stdout is one object
    size = model_file.stat().st_size
    assert published["command"] == "publish" and published["model"] == "cli-json" and published["version"] >= 1
    assert published["bytes"] == size and published["step"] == 7 and published["seconds"] > 0
    assert published["file"] == str(model_file) and published["node"] == node.address
    out = tmp_path / "pulled.safetensors"
    q = run("pull", "cli-json", "-o", str(out), "--connect", node.address, "--json")
    assert q.returncode == 0, q.stderr
    assert q.stderr == ""
    pulled = json.loads(q.stdout)
    assert pulled["command"] == "pull" and pulled["version"] == published["version"] and pulled["bytes"] == size
    assert pulled["file"] == str(out) and pulled["path"] == "map" and pulled["step"] == 7
    assert re.fullmatch(r"[0-9a-f]{16}", pulled["checksum"]) and pulled["seconds"] > 0
    a, b = viper.Snapshot.open(str(model_file)), viper.Snapshot.open(str(out))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a.keys())
    # Without --json: the one human line, as before.
    r = run("pull", "cli-json", "-o", str(tmp_path / "again.safetensors"), "--connect", node.address)
    assert r.returncode == 0 and r.stdout.startswith("pulled cli-json version ") and r.stderr == ""


def test_publish_json_reports_the_step_the_node_records(node, model_file):
    """Without --step the node records the file's own viper.step (7 here); --json reported 0."""
    p = run("publish", "cli-step", str(model_file), "--connect", node.address, "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["step"] == 7, p.stdout
    assert node.latest("cli-step")["step"] == 7


def test_progress_is_drawn_on_a_terminal_only(node, model_file, tmp_path):
    rc, out, tty = run_with_stderr_on_a_pty("publish", "cli-tty", str(model_file), "--connect", node.address, "--json")
    assert rc == 0, tty
    assert json.loads(out)["model"] == "cli-tty"  # stdout stays clean JSON
    assert "sending [" in tty and "########################################]" in tty, tty
    assert "16.8 MB / 16.8 MB\r\n" in tty, tty  # the bar ends at the whole size, then a new line
    rc, out, tty = run_with_stderr_on_a_pty("pull", "cli-tty", "-o", str(tmp_path / "p.safetensors"), "--connect",
                                            node.address)
    assert rc == 0, tty
    assert out.startswith("pulled cli-tty version ")
    assert "writing [" in tty and "########################################]" in tty, tty
    # A failure after a bar: the error is one line of its own.
    rc, out, tty = run_with_stderr_on_a_pty("pull", "no-such-model", "-o", str(tmp_path / "x.safetensors"),
                                            "--connect", node.address, "--json")
    assert rc == 1 and out == ""
    assert re.search(r"(^|\n)viper pull: .*no-such-model", tty.replace("\r\n", "\n")), tty


def subcommands(*prefix):
    """The subcommands `viper PREFIX --help` lists."""
    p = run(*prefix, "--help")
    assert p.returncode == 0
    parts = re.split(r"SUBCOMMANDS:|Subcommands:", p.stdout, maxsplit=1)
    if len(parts) == 1:
        return []
    return re.findall(r"^\s{2}(\S+)\s", parts[1].split("Exit codes:", 1)[0], flags=re.M)


def test_every_help_lists_the_exit_codes():
    names = subcommands()
    assert {"publish", "pull", "watch", "serve", "ls"} <= set(names)
    commands = [[name] for name in names]
    commands += [[name, nested] for name in names for nested in subcommands(name)]  # bench-peer subscribe, ...
    for args in [[]] + commands:
        args = args + ["--help"]
        p = run(*args)
        assert p.returncode == 0, (args, p.stderr)
        text = p.stdout
        assert "Exit codes:" in text, args
        for line in ("  0  success", "  1  failure", "  2  bad arguments"):
            assert line in text, (args, line)


def test_the_exit_codes_are_the_ones_listed(node, tmp_path):
    assert run("pull", "m", "-o", str(tmp_path / "o"), "--connect", "not-an-address").returncode == 2
    assert run("publish", "m", str(tmp_path / "missing.safetensors"), "--connect", node.address).returncode == 2
    assert run("pull", "absent", "-o", str(tmp_path / "o"), "--connect", node.address).returncode == 1
    # --path file reads the node's file tier: without --file-dir it read ./MODEL/ wherever it ran
    assert run("watch", "m", "--connect", node.address, "--path", "file").returncode == 2


def test_pull_writes_into_a_fifo_follows_a_link_and_leaves_no_temporary_when_interrupted(node, model_file, tmp_path):
    """Before: -o FIFO or -o link replaced it with a regular file (the reader got nothing; as root,
    -o /dev/stdout would have replaced /dev/stdout), and SIGINT or SIGTERM during the write left a
    temporary of up to the model's size, under a new name each time."""
    import signal
    import threading
    import time
    assert run("publish", "cli-out", str(model_file), "--connect", node.address).returncode == 0
    first = tmp_path / "first.safetensors"
    assert run("pull", "cli-out", "-o", str(first), "--connect", node.address).returncode == 0
    plain_size = first.stat().st_size
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(len(open(fifo, "rb").read())))
    reader.start()
    p = run("pull", "cli-out", "-o", str(fifo), "--connect", node.address)
    reader.join(30)
    assert p.returncode == 0 and got == [plain_size] and fifo.is_fifo(), (p.stderr, got)
    target = tmp_path / "target.safetensors"
    target.write_bytes(b"old")
    link = tmp_path / "link"
    link.symlink_to(target.name)
    assert run("pull", "cli-out", "-o", str(link), "--connect", node.address).returncode == 0
    plain = tmp_path / "plain.safetensors"
    assert run("pull", "cli-out", "-o", str(plain), "--connect", node.address).returncode == 0
    assert link.is_symlink() and target.read_bytes() == plain.read_bytes()

    big = tmp_path / "big.safetensors"  # 256 MiB: its write and fsync take long enough to interrupt
    viper.build_snapshot({"w": np.ones(1 << 26, np.float32)}).save(str(big))
    assert run("publish", "cli-big", str(big), "--connect", node.address, timeout=300).returncode == 0
    out = tmp_path / "out"
    out.mkdir()
    interrupted = 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = subprocess.Popen([VIPER, "pull", "cli-big", "-o", str(out / "b.safetensors"), "--connect",
                                 node.address], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and not any(".tmp." in f for f in os.listdir(out)):
            time.sleep(0.001)
        if proc.poll() is None:
            proc.send_signal(sig)
            interrupted += 1
        rc = proc.wait(60)
        assert not any(".tmp." in f for f in os.listdir(out)), (sig, rc, os.listdir(out), proc.stderr.read()[-500:])
        for f in os.listdir(out):
            os.unlink(out / f)
    assert interrupted >= 1, "the pull finished before it could be interrupted"
