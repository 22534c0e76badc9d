"""viper.neardata: PipeStores relabel their shard into a real SQLite label database on every new
version (deltas across the network path), take a version at the next batch boundary, resume after
kill -9 without losing a committed label, refuse a foreign or corrupt database, and feed a Tuner
features (FT-DMP) pipelined and not.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_neardata.py
"""
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import textwrap
import time

import numpy as np
import pytest
import torch

import viper
import viper.neardata as nd
from viper import _ndsynth as synth
from viper._labeldb import LabelDB
from viper._tuner import accuracy
from helpers import wait_until

PY = "/usr/bin/python3"


def _env(**extra):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _expected_labels(module, shard):
    src = viper.data.open_source(shard)
    raw = np.stack([src.read(i) for i in range(len(src))])
    with torch.no_grad():
        return module(torch.from_numpy(raw).view(torch.float32)).argmax(dim=1).numpy()


def _rows(db_path):
    with LabelDB(db_path, readonly=True) as db:
        return {r["id"]: r for r in db.rows()}


def test_relabels_every_version_with_deltas_and_takes_a_version_mid_pass(tmp_path):
    shard = tmp_path / "shard.rec"
    synth.write_shard(shard, 600, seed=1)
    model = synth.build()
    pub = viper.Publisher("nd1", listen="127.0.0.1:0", mode="sync", delta="always")
    store = nd.PipeStore("nd1", "viper._ndsynth:build", shard, tmp_path / "labels.db", connect=pub.address,
                         transform="viper._ndsynth:slow_transform", batch_size=50, path="remote")
    try:
        os.environ["VIPER_NDSYNTH_SLEEP"] = "0.02"
        v1 = pub.publish(model.state_dict(), step=1).version
        s = store.wait_refreshed(v1, timeout=60)
        assert s["done"] == s["total"] == 600 and s["passes"] == 1
        rows = _rows(tmp_path / "labels.db")
        assert len(rows) == 600 and {r["version"] for r in rows.values()} == {v1}
        np.testing.assert_array_equal([rows[i]["label"] for i in range(600)], _expected_labels(model, shard))
        assert all(0 < r["score"] <= 1 for r in rows.values())

        # v2 arrives while the pass for v2's predecessor runs: taken at a batch boundary.
        os.environ["VIPER_NDSYNTH_SLEEP"] = "0.1"  # 10 batches left once 100 are done: v3 has >= 1 s to arrive
        synth.perturb(model, seed=2, scale=0.5)
        v2 = pub.publish(model.state_dict(), step=2).version
        wait_until(lambda: store.stats()["version"] == v2 and store.stats()["done"] >= 100, 30,
                   lambda: f"v2 taken and 100 labels done: {store.stats()}")
        # Slower still while v3 is on its way: at most 10 batches are left, 5 s for v3 to be
        # published, fetched as a delta and taken on a loaded machine.
        os.environ["VIPER_NDSYNTH_SLEEP"] = "0.5"
        synth.perturb(model, seed=3, scale=0.5)
        v3 = pub.publish(model.state_dict(), step=3).version
        # The pass stays slow until the store has taken v3 (at its next batch boundary): v3's fetch
        # must not race the pass's last batches.
        wait_until(lambda: store.stats()["version"] == v3, 30, lambda: f"v3 taken: {store.stats()}")
        os.environ["VIPER_NDSYNTH_SLEEP"] = "0.0"
        s = store.wait_refreshed(v3, timeout=60)
        assert s["switches"] >= 1, s  # v3 came mid-pass and was taken there
        rows = _rows(tmp_path / "labels.db")
        assert {r["version"] for r in rows.values()} == {v3}
        np.testing.assert_array_equal([rows[i]["label"] for i in range(600)], _expected_labels(model, shard))
        assert s["subscriber"]["deltas"] >= 1 and s["wire_bytes"] > 0
        out = subprocess.run([PY, "-m", "viper.neardata", "labels", str(tmp_path / "labels.db"), "--stale", "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout == "", out.stderr  # nothing older than the newest seen
    finally:
        os.environ.pop("VIPER_NDSYNTH_SLEEP", None)
        store.close()
        pub.close()


def test_foreign_corrupt_and_other_model_databases_are_refused_untouched(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(8192))
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE labels(id INTEGER PRIMARY KEY, label INTEGER)")
    conn.commit()
    conn.close()
    good = tmp_path / "good.db"
    LabelDB(good, model="m1").close()
    corrupt = tmp_path / "corrupt.db"
    data = bytearray(good.read_bytes())
    data[100:] = os.urandom(len(data) - 100)  # the header is SQLite's, the pages are garbage
    corrupt.write_bytes(bytes(data))
    cases = {junk: "not an SQLite database", foreign: "application_id 0x0", corrupt: "refusing"}
    for path, why in cases.items():
        before = _digest(path)
        with pytest.raises(viper.InvalidArgumentError, match=why):
            LabelDB(path, model="m1")
        out = subprocess.run([PY, "-m", "viper.neardata", "labels", str(path)], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and why in out.stderr and "left untouched" in out.stderr, out.stderr
        assert _digest(path) == before
    with pytest.raises(viper.InvalidArgumentError, match="labels of model 'm1', not 'm2'"):
        LabelDB(good, model="m2")
    # A database of another model in rollback-journal mode (a backup by VACUUM INTO) stays so:
    # before, it was switched to WAL before its model was checked.
    conn = sqlite3.connect(good, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    before = _digest(good)
    with pytest.raises(viper.InvalidArgumentError, match="labels of model 'm1', not 'm2'.*left untouched"):
        LabelDB(good, model="m2")
    assert _digest(good) == before
    shard = tmp_path / "shard.rec"
    synth.write_shard(shard, 10, seed=1)
    before = _digest(foreign)
    out = subprocess.run([PY, "-m", "viper.neardata", "serve", "--model", "m1", "--factory", "viper._ndsynth:build",
                          "--data", str(shard), "--labels", str(foreign), "--connect", "127.0.0.1:1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "application_id 0x0" in out.stderr and "left untouched" in out.stderr, out.stderr
    assert _digest(foreign) == before
    # A database of another shard of the same model: before, its labels were taken as this shard's
    # (a store on b.rec with a.rec's database read nothing and reported every sample done).
    other = tmp_path / "other.rec"
    synth.write_shard(other, 12, seed=2)
    shared = tmp_path / "shared.db"
    nd.PipeStore("m1", synth.build, shard, shared, registry="embedded").close()
    before = _digest(shared)
    with pytest.raises(viper.InvalidArgumentError, match=r"holds labels of the shard .*shard.rec \(10 samples\), not "
                                                         r"of .*other.rec \(12 samples\)"):
        nd.PipeStore("m1", synth.build, other, shared, registry="embedded")
    assert _digest(shared) == before
    nd.PipeStore("m1", synth.build, shard, shared, registry="embedded").close()  # its own shard: fine
    # A run refused for another argument leaves a new database unmade (before, it was stamped with
    # the mistyped model, and the next run with the right one was refused).
    fresh = tmp_path / "fresh.db"
    out = subprocess.run([PY, "-m", "viper.neardata", "serve", "--model", "typo", "--factory", "viper._ndsynth:build",
                          "--data", str(shard), "--labels", str(fresh), "--connect", "127.0.0.1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "127.0.0.1" in out.stderr and not fresh.exists(), out.stderr


def _serve(tmp_path, shard, db, address, sleep):
    log = open(tmp_path / "serve.log", "a")
    return subprocess.Popen([PY, "-m", "viper.neardata", "serve", "--model", "nd3", "--factory", "viper._ndsynth:build",
                             "--transform", "viper._ndsynth:slow_transform", "--data", str(shard), "--labels", str(db),
                             "--connect", address, "--batch-size", "40", "--json", "--path", "remote"],
                            stdout=subprocess.PIPE, stderr=log, text=True, env=_env(VIPER_NDSYNTH_SLEEP=sleep))


def _events(proc, until, timeout=60):
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        event = json.loads(line)
        seen.append(event)
        if until(event):
            return seen
    raise AssertionError(f"no such event in {seen}")


def test_kill9_mid_pass_loses_no_committed_label_and_resumes(tmp_path):
    shard, db = tmp_path / "shard.rec", tmp_path / "labels.db"
    synth.write_shard(shard, 2000, seed=4)
    model = synth.build()
    pub = viper.Publisher("nd3", listen="127.0.0.1:0", mode="sync")
    proc = _serve(tmp_path, shard, db, pub.address, "0.03")
    try:
        _events(proc, lambda e: e["event"] == "ready")
        version = pub.publish(model.state_dict()).version

        def part_committed():
            with LabelDB(db, readonly=True) as reader:
                if reader.count(version) >= 400:
                    return True
            assert proc.poll() is None, f"the store exited with {proc.returncode}"
            return False

        # Wait until part of the pass is committed, then kill -9 mid-pass.
        wait_until(part_committed, 60, "400 labels committed", interval=0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        committed = _rows(db)
        assert 400 <= len(committed) < 2000, len(committed)  # killed mid-pass, batches whole
        assert len(committed) % 40 == 0
        proc = _serve(tmp_path, shard, db, pub.address, "0")
        events = _events(proc, lambda e: e["event"] == "refreshed")
        resumed = [e for e in events if e["event"] == "version"][0]
        assert resumed["done"] == len(committed), resumed  # it starts where it stopped
        rows = _rows(db)
        assert len(rows) == 2000 and {r["version"] for r in rows.values()} == {version}
        for i, row in committed.items():
            assert rows[i] == row  # untouched: same label, score, version and time
        np.testing.assert_array_equal([rows[i]["label"] for i in range(2000)], _expected_labels(model, shard))
    finally:
        proc.kill()
        proc.wait()
        pub.close()


def _baseline_accuracy(stores, epochs, chunks, seed, test_x, test_y):
    """The disaggregated computation on the same samples, order and seeds (local files here)."""
    from viper._tuner import make_optimizer, train_round
    module = synth.build()
    optimizer = make_optimizer(module, 0.2)
    shards = []
    for path in stores:
        src = viper.data.open_source(path)
        shards.append((np.stack([src.read(i) for i in range(len(src))]), np.array([src.label(i) for i in range(len(src))])))
    for k in range(epochs * chunks):
        xs, ys = [], []
        for raw, labels in shards:
            idx = np.array_split(np.arange(len(labels)), chunks)[k % chunks]
            with torch.no_grad():
                xs.append(module.backbone(torch.from_numpy(raw[idx]).view(torch.float32)))
            ys.append(torch.from_numpy(labels[idx]))
        train_round(module, optimizer, torch.cat(xs), torch.cat(ys), seed=seed, round_index=k, minibatch=64,
                    local_epochs=3)
    return accuracy(module, test_x, test_y)


@pytest.mark.parametrize("pipelined", [True, False])
def test_ft_dmp_tuner_trains_on_store_features_and_versions_flow_back_as_deltas(tmp_path, pipelined):
    paths = []
    for s in range(2):
        paths.append(tmp_path / f"s{s}.rec")
        synth.write_shard(paths[-1], 400, seed=10 + s)
    test_x, test_y = synth.samples(500, seed=99)
    test_x = torch.from_numpy(test_x.reshape(len(test_y), -1))
    test_y = torch.from_numpy(test_y)
    tuner = nd.Tuner("nd4", "viper._ndsynth:build", stores={}, listen="127.0.0.1:0", seed=5, lr=0.2,
                     local_epochs=3, delta="always")
    stores = [nd.PipeStore("nd4", "viper._ndsynth:build", p, tmp_path / f"s{i}.db", connect=tuner.address,
                           name=f"s{i}", features_listen="127.0.0.1:0", batch_size=100, path="remote")
              for i, p in enumerate(paths)]
    try:
        tuner.stores = {s.name: s.features_address for s in stores}
        before = accuracy(tuner.module, test_x, test_y)
        report = tuner.finetune(epochs=2, chunks=2, pipelined=pipelined, timeout=60)
        assert report["rounds"] == 4 and len(report["losses"]) == 4
        after = accuracy(tuner.module, test_x, test_y)
        assert after > before + 0.2, (before, after)
        baseline = _baseline_accuracy(paths, 2, 2, 5, test_x, test_y)
        assert abs(after - baseline) <= 0.01, (after, baseline)
        tuner.publisher.wait()  # an async publish is announced in the background
        final = tuner.publisher.announced_version
        raw_bytes = sum(os.path.getsize(p) for p in paths) * 2  # two epochs of raw samples
        for s in stores:
            st = s.wait_refreshed(final, timeout=60)  # relabelled with the fine-tuned model
            assert st["feature_rounds"] == 4
            assert st["subscriber"]["deltas"] >= 3, st["subscriber"]  # only the head changed
        feature_bytes = sum(s.stats()["feature_bytes"] for s in stores)
        assert feature_bytes < 0.1 * raw_bytes, (feature_bytes, raw_bytes)
        rows = _rows(tmp_path / "s0.db")
        assert {r["version"] for r in rows.values()} == {final}
    finally:
        for s in stores:
            s.close()
        tuner.close()


@pytest.mark.parametrize("pipelined", [True, False])
def test_pipelined_stores_extract_the_next_round_while_the_tuner_trains(tmp_path, pipelined):
    """Pipelined, a store extracts round k+1 as soon as it has published round k, without waiting
    for the Tuner's version of round k-1 (depth 2): the Tuner, held up after training round 0,
    finds round 1 waiting and the stores have round 2 extracted before it takes round 1. Non-
    pipelined, every round is extracted with the weights trained through the round before. In
    both, the version a store held when it extracted round k has ft_round >= k-1-depth."""
    paths = []
    for s in range(2):
        paths.append(tmp_path / f"s{s}.rec")
        synth.write_shard(paths[-1], 200, seed=20 + s)
    tuner = nd.Tuner("nd5", "viper._ndsynth:build", stores={}, listen="127.0.0.1:0", seed=3, lr=0.2,
                     local_epochs=2, delta="always")
    events = []
    stores = [nd.PipeStore("nd5", "viper._ndsynth:build", p, tmp_path / f"s{i}.db", connect=tuner.address,
                           name=f"s{i}", features_listen="127.0.0.1:0", path="remote", on_event=events.append)
              for i, p in enumerate(paths)]
    taken = {}
    hold = 2.0  # the Tuner trains round 0 this long: the stores may run ahead meanwhile (2 s: slack on a loaded machine)

    def on_round(r):
        taken[r["round"]] = time.time()
        if r["round"] == 0:
            time.sleep(hold)

    try:
        tuner.stores = {s.name: s.features_address for s in stores}
        report = tuner.finetune(epochs=2, chunks=2, pipelined=pipelined, timeout=60, on_round=on_round)
        depth = 2 if pipelined else 0
        tuner.publisher.wait()  # an async publish is announced in the background
        for s in stores:
            s.wait_refreshed(tuner.publisher.announced_version, timeout=60)
            rounds = {e["round"]: e for e in events if e["event"] == "features" and e["store"] == s.name
                      and e["job"] == report["job"]}
            assert sorted(rounds) == [0, 1, 2, 3], rounds
            for k, e in rounds.items():
                assert e["held_round"] >= k - 1 - depth, (s.name, k, e)
            # The features event of round k comes once it is published (after its extraction).
            if pipelined:
                assert rounds[1]["time"] < taken[0] + hold, rounds[1]  # sent while the Tuner trained round 0
                assert rounds[2]["held_round"] == -1, rounds[2]  # extracted before round 0's weights existed
                assert rounds[2]["hold_seconds"] > 0.3, rounds[2]  # then held until the Tuner took round 1
            else:
                assert [rounds[k]["held_round"] for k in range(4)] == [-1, 0, 1, 2], rounds
        assert report["timeline"][1]["wait"] < (0.5 if pipelined else 10), report["timeline"]
    finally:
        for s in stores:
            s.close()
        tuner.close()


def test_a_store_finds_the_model_through_a_registry(tmp_path):
    shard = tmp_path / "shard.rec"
    synth.write_shard(shard, 300, seed=6)
    model = synth.build()
    with pytest.raises(viper.InvalidArgumentError, match="exactly one of connect=HOST:PORT and registry=URL"):
        nd.PipeStore("nd5", synth.build, shard, tmp_path / "x.db", connect="127.0.0.1:1", registry="embedded")
    with pytest.raises(viper.InvalidArgumentError, match="must be MODULE:FUNCTION"):
        nd.PipeStore("nd5", "no_colon", shard, tmp_path / "x.db", registry="embedded")
    with pytest.raises(viper.InvalidArgumentError, match="ids: sample 0 is listed twice"):
        nd.PipeStore("nd5", synth.build, shard, tmp_path / "x.db", registry="embedded", ids=[0, 0, 1])
    pub = viper.Publisher("nd5", listen="127.0.0.1:0", mode="sync", registry="embedded")
    store = nd.PipeStore("nd5", synth.build, shard, tmp_path / "labels.db", registry="embedded", path="remote")
    try:
        version = pub.publish(model.state_dict()).version
        store.wait_refreshed(version, timeout=60)
        rows = _rows(tmp_path / "labels.db")
        np.testing.assert_array_equal([rows[i]["label"] for i in range(300)], _expected_labels(model, shard))
    finally:
        store.close()
        pub.close()


def test_labels_command_prints_rows_and_the_stale_ones_as_json(tmp_path):
    path = tmp_path / "l.db"
    with LabelDB(path, model="m") as db:
        db.note_version(1)
        db.write_batch([0, 1, 2], [3, 4, 5], [0.5, 0.25, 0.125], version=1)
        db.note_version(2)
        db.write_batch([1], [7], [0.75], version=2)  # one batch, one transaction
    out = subprocess.run([PY, "-m", "viper.neardata", "labels", str(path), "--stale", "--json"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["id"], r["label"], r["score"], r["version"]) for r in rows] == [(0, 3, 0.5, 1), (2, 5, 0.125, 1)]
    assert all(r["time"] > 0 for r in rows)
    out = subprocess.run([PY, "-m", "viper.neardata", "labels", str(path)], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines() == ["0\t3\t0.5000\t1 (stale)", "1\t7\t0.7500\t2", "2\t5\t0.1250\t1 (stale)"]
    with LabelDB(path, model="m") as db:  # the model's numbering started again: 1 is newer than 2,
        db.note_version(1)                  # and the old run's labels of 1 are not the new run's
        assert [r["id"] for r in db.rows(stale=True)] == [0, 1, 2] and db.ids_not_at(1, range(3)) == [0, 1, 2]
        assert {r["version"] for r in db.rows()} == {0}


def test_a_restarted_numbering_that_reaches_the_same_number_is_told_by_its_publish_time(tmp_path):
    """Before, a producer restarted without a file tier whose new version had the number the store
    last labelled (another model) found every label current: nothing was relabelled."""
    with LabelDB(tmp_path / "l.db", model="m") as db:
        db.note_version(3, publish_ns=1000)
        db.write_batch([0, 1], [5, 6], [0.5, 0.5], version=3)
        db.note_version(3, publish_ns=1000)  # the same version seen again
        assert db.ids_not_at(3, range(2)) == []
        db.note_version(3, publish_ns=2000)  # another version numbered 3
        assert db.ids_not_at(3, range(2)) == [0, 1] and [r["id"] for r in db.rows(stale=True)] == [0, 1]
        db.write_batch([0], [7], [0.5], version=3)
        db.note_version(4, publish_ns=3000)  # onwards as usual: labels of 3 are stale, none is lost
        assert db.ids_not_at(4, range(2)) == [0, 1] and db.count() == 2


def test_a_postprocess_that_returns_fewer_labels_fails_the_store(tmp_path):
    """Before, the rows it did not return were dropped, wait_refreshed() said every sample was
    done, and the store then read the shard again and again without end."""
    shard = tmp_path / "shard.rec"
    synth.write_shard(shard, 100, seed=2)
    pub = viper.Publisher("nd6", listen="127.0.0.1:0", mode="sync")
    store = nd.PipeStore("nd6", synth.build, shard, tmp_path / "l.db", connect=pub.address, path="remote",
                         postprocess=__name__ + ":_short_postprocess", batch_size=10)
    try:
        pub.publish(synth.build().state_dict())
        wait_until(lambda: store.stats()["state"] == "failed", 60, "the store fails")
        assert "postprocess returned labels of shape (9,) and scores of shape (9,) for a batch of 10 samples" in \
            store.stats()["error"]
        assert store.stats()["samples"] == 0
    finally:
        store.close()
        pub.close()


def test_a_store_with_fewer_samples_than_chunks_sends_empty_rounds(tmp_path):
    """Before, a round with no ids of this store (np.array_split past the samples) sent the whole
    shard: ids=[] was "every sample" to the prefetcher."""
    shard = tmp_path / "s.rec"
    synth.write_shard(shard, 6, seed=3)
    tuner = nd.Tuner("nd7", "viper._ndsynth:build", stores={}, listen="127.0.0.1:0", seed=5, lr=0.2, local_epochs=1)
    store = nd.PipeStore("nd7", "viper._ndsynth:build", shard, tmp_path / "l.db", connect=tuner.address, name="s0",
                         features_listen="127.0.0.1:0", batch_size=100, path="remote")
    samples = []
    try:
        tuner.stores = {"s0": store.features_address}
        report = tuner.finetune(epochs=1, chunks=8, timeout=60, on_round=lambda r: samples.append(r["samples"]))
        assert report["rounds"] == 8 and samples == [1, 1, 1, 1, 1, 1, 0, 0], samples
        assert store.stats()["error"] is None
    finally:
        store.close()
        tuner.close()


def test_bad_paths_factories_and_tuner_arguments_get_one_line(tmp_path):
    """Before: tracebacks (IsADirectoryError, sqlite3.OperationalError, socket.gaierror,
    AttributeError), a fileserver that served a missing directory as 404s, and a Tuner that ran
    chunks=0 or epochs=-1 as 0 or -2 rounds."""
    for args, why in ((["labels", str(tmp_path)], "is a directory"),
                      (["labels", str(tmp_path / "no" / "l.db")], "does not exist"),
                      (["fileserver", "--dir", str(tmp_path / "no")], "is not a directory"),
                      (["fileserver", "--dir", str(tmp_path), "--listen", "nohost.invalid:0", "--insecure"],
                       "cannot listen there"),
                      # Plain HTTP, no token: beyond loopback only when asked for.
                      (["fileserver", "--dir", str(tmp_path), "--listen", "0.0.0.0:0"], "give --insecure to mean it"),
                      (["serve", "--model", "m", "--factory", "os:getcwd", "--data", "x", "--labels",
                        str(tmp_path / "l.db"), "--connect", "127.0.0.1:1"], "returned a str, not a torch.nn.Module")):
        out = subprocess.run([PY, "-m", "viper.neardata", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and why in out.stderr and out.stderr.count("\n") == 1, (args, out.stderr)
    # The node's refusal to listen beyond loopback without a token names --insecure: serve has it.
    out = subprocess.run([PY, "-m", "viper.neardata", "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert "--insecure" in out.stdout, out.stdout
    tuner = nd.Tuner("nd8", "viper._ndsynth:build", stores={}, listen="127.0.0.1:0")
    try:
        with pytest.raises(viper.InvalidArgumentError, match="no stores"):
            tuner.finetune()
        tuner.stores = {"s": "127.0.0.1:1"}
        for bad in ({"chunks": 0}, {"epochs": -1}, {"chunks": 2.5}):
            with pytest.raises(viper.InvalidArgumentError, match="must be an int >= 1"):
                tuner.finetune(**bad)
    finally:
        tuner.close()


def test_a_script_that_leaves_its_store_and_tuner_open_exits_cleanly(tmp_path):
    """Before: SIGABRT at every exit ("terminate called without an active exception": the store's
    worker thread was inside a wait when the interpreter ended it), and the database's -wal and
    -shm files stayed."""
    shard = tmp_path / "s.rec"
    synth.write_shard(shard, 50, seed=4)
    script = textwrap.dedent("""
        import sys
        import viper.neardata as nd
        tuner = nd.Tuner("nd9", "viper._ndsynth:build", stores={}, listen="127.0.0.1:0")
        store = nd.PipeStore("nd9", "viper._ndsynth:build", sys.argv[1], sys.argv[2], connect=tuner.address,
                             path="remote")
        store.wait_refreshed(tuner.publish().version, timeout=60)
        print("refreshed", flush=True)
    """)
    p = subprocess.run([PY, "-c", script, str(shard), str(tmp_path / "l.db")], capture_output=True, text=True,
                       timeout=120, env=_env())
    assert p.returncode == 0 and p.stdout == "refreshed\n", (p.returncode, p.stderr[-3000:])
    assert sorted(os.listdir(tmp_path)) == ["l.db", "s.rec"], os.listdir(tmp_path)


def _short_postprocess(out):
    labels, scores = nd.softmax_postprocess(out)
    return labels[:-1], scores[:-1]


def test_serve_json_events_from_many_threads_stay_one_per_line():
    """`serve --json` prints the store's events from its threads while the main thread prints
    `ready` and `stats`. With print() (the text and its newline written separately) a reader got
    two events on one line now and then (test_kill9's reader failed 2 of 6 loaded suite runs);
    with 8 threads of 2,000 events each, 657 of 16,000 lines were broken."""
    script = textwrap.dedent("""
        import threading
        from viper import _neardata_cli as cli
        def emit(thread):
            for i in range(2000):
                cli._print_event(True, {"event": "progress", "store": "s", "thread": thread, "i": i})
        threads = [threading.Thread(target=emit, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    """)
    p = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=120, env=_env())
    assert p.returncode == 0, p.stderr[-3000:]
    events = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(events) == 16000
    for thread in range(8):
        assert [e["i"] for e in events if e["thread"] == thread] == list(range(2000))
