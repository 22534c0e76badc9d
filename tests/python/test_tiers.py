"""Every version a node lists can be fetched, by every path, from every tier (real processes).

A `viper serve` node keeps 3 versions on its file tier and fewer in memory; `viper ls` lists them,
and `viper pull` on the node's own host (a lease on a segment), the Python Subscriber (map and copy
over the same lease path, through the C++ Subscriber) and a SEND fetch must each get every listed
version bit-exact, also after a kill -9 restart, when the older versions exist only as files.

With the file tier on a small tmpfs (needs root, as CI runs), four 30 MB versions fill the disk: a
version whose flush failed stays in memory and listed (and fetchable) instead of being lost, a
segment replica never names a segment that holds another version, and when the memory budget for
unflushed versions (NodeOptions.unflushed_budget_bytes) forces one out, it is de-listed with a
warning naming it.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import viper
from helpers import wait_until

BUILD = Path(os.environ.get("VIPER_BINARY_DIR", Path(__file__).resolve().parents[2] / "build"))
VIPER = str(BUILD / "bin" / "viper")
MODEL = "tiers"


def run(*args, timeout=120):
    return subprocess.run([VIPER, *args], capture_output=True, text=True, timeout=timeout)


def must(*args, timeout=120):
    out = run(*args, timeout=timeout)
    assert out.returncode == 0, f"viper {' '.join(args)}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


class Serve:
    """`viper serve` as a child process, its log in a file."""

    def __init__(self, tmp: Path, store: Path, keep_host: int, prefix: str, keep_files: int = 3):
        self.tmp, self.store = tmp, store
        self.args = ["serve", "--listen", "127.0.0.1:0", "--store-dir", str(store), "--keep-host-versions", str(keep_host),
                     "--keep-file-versions", str(keep_files), "--segment-prefix", prefix]
        self.lives = 0
        self.start()

    def start(self):
        self.lives += 1
        addr = self.tmp / f"addr{self.lives}"
        self.log_path = self.tmp / f"serve{self.lives}.log"
        self.proc = subprocess.Popen([VIPER, *self.args, "--address-file", str(addr)],
                                     stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)

        def listening():
            if addr.exists():
                return True
            assert self.proc.poll() is None, self.log()
            return False

        wait_until(listening, 30, lambda: "viper serve did not listen\n" + self.log(), interval=0.05)
        self.address = addr.read_text().strip()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(60) == 0, self.log()


def make_input(tmp: Path, version: int, nbytes: int) -> Path:
    """A safetensors file whose bytes say which version it is."""
    path = tmp / f"input{version}.safetensors"
    w = (np.arange(nbytes // 4, dtype=np.uint32) * 2654435761 + version).astype(np.uint32)
    viper.build_snapshot({"w": w, "version": np.array([version], dtype=np.int64)}).save(str(path))
    return path


def tensors_of(path) -> dict:
    snap = viper.Snapshot.open(str(path))
    return {name: np.array(snap[name]).tobytes() for name in snap.keys()}


def listed(address: str) -> list:
    return [v for v in json.loads(must("ls", "--connect", address, "--json")) if v["model"] == MODEL]


def stats(address: str) -> dict:
    return json.loads(must("stats", "--connect", address, "--json"))


def wait_stored(store: Path, want: list, timeout=60):
    def have():
        return sorted(int(p.stem) for p in (store / MODEL).glob("*.safetensors"))

    wait_until(lambda: have() == want, timeout, lambda: f"files of versions {have()} in {store / MODEL}, not {want}",
               interval=0.05)


def check_listed_pull(tmp: Path, address: str, inputs: dict, store: Path) -> list:
    """Pulls every listed version on the node's host: each must be bit-exact. Returns the listing."""
    versions = listed(address)
    segments = [r for v in versions for r in v["replicas"] if r.startswith("shm:")]
    assert len(segments) == len(set(segments)), f"two listed versions name one segment: {versions}"
    for v in versions:
        out = tmp / f"pulled{v['version']}.safetensors"
        must("pull", MODEL, "--version", str(v["version"]), "-o", str(out), "--connect", address)
        assert tensors_of(out) == tensors_of(inputs[v["version"]]), f"version {v['version']} differs"
        on_file = store / MODEL / f"{v['version']}.safetensors"
        if on_file.exists():
            assert out.read_bytes() == on_file.read_bytes(), f"version {v['version']} differs from its file"
        out.unlink()
    return versions


def test_every_listed_version_is_pulled_on_the_nodes_host_also_after_kill9():
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        store = tmp / "store"
        node = Serve(tmp, store, keep_host=1, prefix=f"vtiers{os.getpid()}")
        try:
            inputs = {v: make_input(tmp, v, 1 << 20) for v in range(1, 5)}
            for v in range(1, 5):
                assert f"version {v}" in must("publish", MODEL, str(inputs[v]), "--connect", node.address)
            wait_stored(store, [2, 3, 4])  # the 4th file written, the 1st retired
            wait_until(lambda: [v["version"] for v in listed(node.address)] == [2, 3, 4], 30,  # ...and de-listed
                       lambda: f"listed {listed(node.address)}, not versions [2, 3, 4]", interval=0.05)
            versions = check_listed_pull(tmp, node.address, inputs, store)
            assert [v["version"] for v in versions] == [2, 3, 4], versions
            memory = [v["version"] for v in versions if any(r.startswith("shm:") for r in v["replicas"])]
            assert memory == [4], f"keep-host-versions 1: only version 4 is in memory, listed {versions}"
            assert stats(node.address)["leases_from_file"] == 2, "versions 2 and 3 came from their files"

            node.kill9()
            node.start()  # recovers version 4 into memory; 2 and 3 exist only as files
            versions = check_listed_pull(tmp, node.address, inputs, store)
            assert [v["version"] for v in versions] == [2, 3, 4], versions
            node.stop()

            # A node that does not load its files back: every version, the latest too, is file-only.
            # The C++ Subscriber (through Python) maps and copies it from a segment the node loads.
            with viper.Node(store_dir=str(store), keep_host_versions=1, recover=False,
                            segment_prefix=f"vtierspy{os.getpid()}") as py_node:
                assert [v["version"] for v in listed(py_node.address)] == [2, 3, 4]
                for path in ("map", "copy", "remote"):
                    with viper.Subscriber(MODEL, py_node.address, path=path) as sub:
                        got = sub.wait_for(4, timeout=30)
                        assert got.version == 4 and got.path == path, (got.version, got.path, sub.last_error())
                        assert {k: np.array(got[k]).tobytes() for k in got.keys()} == tensors_of(inputs[4]), path
                check_listed_pull(tmp, py_node.address, inputs, store)
            print("\ntiers: versions 2-4 listed and pulled bit-exact on the node's host (keep-host-versions 1, keep-file-versions 3), "
                  "again after kill -9, and by Subscriber map/copy/remote with every version file-only")
        finally:
            if node.proc.poll() is None:
                node.kill9()


class SmallTmpfs:
    def __init__(self, path: Path, megabytes: int):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0700", "tmpfs", str(path)], check=True)

    def close(self):
        subprocess.run(["umount", "-l", str(self.path)], check=False)


def needs_root():
    if os.geteuid() != 0:
        pytest.fail("mounting the small tmpfs needs root (CI runs as root)")


def test_disk_full_keeps_unflushed_versions_listed_and_fetchable():
    """The issue's case: 50 MB tmpfs, four 30 MB versions, default keep-host-versions 2."""
    needs_root()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        store = tmp / "store"
        disk = SmallTmpfs(store, 50)
        node = None
        try:
            node = Serve(tmp, store, keep_host=2, prefix=f"vfull{os.getpid()}")
            inputs = {v: make_input(tmp, v, 30_000_000) for v in range(1, 5)}
            for v in range(1, 5):
                must("publish", MODEL, str(inputs[v]), "--connect", node.address)
            wait_until(lambda: node.log().count("to the file tier failed") >= 3, 60,
                       lambda: "three failed writes to the file tier, log:\n" + node.log(), interval=0.1)
            assert "No space left on device" in node.log()
            versions = check_listed_pull(tmp, node.address, inputs, store)
            numbers = [v["version"] for v in versions]
            assert numbers == [1, 2, 3, 4], f"a version was lost on the full disk: {versions}\n{node.log()}"
            on_file = sorted(int(p.stem) for p in (store / MODEL).glob("*.safetensors"))
            print(f"\ndisk full (50 MB tmpfs, four 30 MB versions): on file {on_file}, listed {numbers}, "
                  f"each pulled bit-exact on the node's host")
            node.stop()  # the clean stop's flushes fail too: nothing to wait for
        finally:
            if node and node.proc.poll() is None:
                node.kill9()
            disk.close()


def test_memory_budget_delists_an_unflushed_version_with_a_warning(capfd):
    """unflushed_budget_bytes of 70 MB holds two failed 30 MB versions, not three: the oldest goes."""
    needs_root()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        store = tmp / "store"
        disk = SmallTmpfs(store, 50)
        try:
            with viper.Node(store_dir=str(store), keep_host_versions=1, unflushed_budget_bytes=70_000_000,
                            segment_prefix=f"vbudget{os.getpid()}") as node:
                inputs = {v: make_input(tmp, v, 30_000_000) for v in range(1, 6)}
                # Each flush ends (written or failed) before the next version comes: the budget
                # then meets failed versions only, never a flush still queued.
                for v in range(1, 6):
                    must("publish", MODEL, str(inputs[v]), "--connect", node.address)
                    node.wait_flushed(60)
                versions = check_listed_pull(tmp, node.address, inputs, store)
                numbers = [v["version"] for v in versions]
                err = capfd.readouterr().err
                sys.stderr.write(err)
                assert "tiers version 2 de-listed" in err and "unflushed_budget_bytes" in err, err
                assert "tiers version 3 de-listed" in err, err
                assert numbers == [1, 4, 5], f"{versions}\n{err}"
                print(f"\nbudget 70 MB, 30 MB versions, disk full after version 1: listed {numbers}, "
                      f"versions 2 and 3 de-listed with a warning naming each")
        finally:
            disk.close()


def test_failed_flushes_are_written_once_the_disk_has_room_again():
    """A filler fills the disk: versions 1 and 2 fail to flush and stay in memory; the filler goes,
    version 3's flush succeeds, and the retries write 1 and 2: all three on file, nothing pinned."""
    needs_root()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        store = tmp / "store"
        disk = SmallTmpfs(store, 50)
        try:
            with viper.Node(store_dir=str(store), keep_host_versions=1,
                            segment_prefix=f"vretry{os.getpid()}") as node:
                filler = store / "filler"
                filler.write_bytes(b"\0" * (45 << 20))
                inputs = {v: make_input(tmp, v, 8_000_000) for v in range(1, 4)}
                for v in (1, 2):
                    must("publish", MODEL, str(inputs[v]), "--connect", node.address)
                node.wait_flushed(60)
                s = stats(node.address)
                assert s["unflushed_versions"] == 2 and s["flush_errors"] == 2, s
                assert [v["version"] for v in check_listed_pull(tmp, node.address, inputs, store)] == [1, 2]
                filler.unlink()
                must("publish", MODEL, str(inputs[3]), "--connect", node.address)
                node.wait_flushed(60)
                s = stats(node.address)
                assert s["unflushed_versions"] == 0 and s["files_flushed"] == 3, s
                assert sorted(int(p.stem) for p in (store / MODEL).glob("*.safetensors")) == [1, 2, 3]
                versions = check_listed_pull(tmp, node.address, inputs, store)
                assert [v["version"] for v in versions] == [1, 2, 3], versions
                segments = [v["version"] for v in versions if any(r.startswith("shm:") for r in v["replicas"])]
                assert segments == [3], f"versions 1 and 2 left memory once written: {versions}"
                print(f"\nretry: 2 flushes failed on the full disk, kept in memory; written by the retries after "
                      f"version 3's flush succeeded; {s['files_flushed']} files, 0 unflushed")
        finally:
            disk.close()
