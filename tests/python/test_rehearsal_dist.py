"""viper.data.DistributedRehearsalBuffer (python/viper/_rehearsal_dist.py): one rehearsal buffer
spread over the shards of data-parallel ranks. Real rank processes, each with its own cache node
on loopback (real UCX) and its own shard: the global draw is that of one reservoir over every
rank's stream (ranks that see 1x, 2x, 3x as many samples are drawn 1:2:3, and uniformly within
each stream), class balance holds over all ranks, and a rank that dies does not hang mix().
The planner and the pack parser alone: seeded trials and malformed packs.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_rehearsal_dist.py
"""
import glob
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import viper
import viper.data as vd
from viper import _rehearsal_dist as rd
from helpers import free_ports

# Chi-square critical values at p = 0.001 (a correct implementation fails one run in a thousand;
# the seeds are fixed, so a run either passes or fails every time).
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def chi2(observed, expected_p):
    observed = np.asarray(observed, dtype=np.float64)
    expected = observed.sum() * np.asarray(expected_p, dtype=np.float64)
    return float(((observed - expected) ** 2 / expected).sum())


RANK = textwrap.dedent(r"""
    import json, os, sys, time
    import numpy as np
    import viper.data as vd
    (rank, world, nodes, workdir, policy, capacity, steps_after, die_rank, die_step) = (
        int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4], sys.argv[5], int(sys.argv[6]),
        int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9]))
    stream = json.loads(sys.argv[10])  # [[label, count], ...]: this rank's stream, in order

    def barrier(name, count=world):
        open(os.path.join(workdir, f"{name}.{rank}"), "w").close()
        deadline = time.time() + 120
        while sum(os.path.exists(os.path.join(workdir, f"{name}.{r}")) for r in range(count)) < count:
            if time.time() > deadline:
                sys.exit(f"rank {rank}: barrier {name} timed out")
            time.sleep(0.01)

    src = vd.callable_source(lambda i: bytes(16), [16])
    cache = vd.SampleCache(src, nodes, rank, token="t0ken", timeout=2.0, retry_down=60.0)
    buf = vd.DistributedRehearsalBuffer(capacity, cache=cache, sample_shape=(2,), dtype="float64", ratio=1.0,
                                        policy=policy, seed=11, pack=64, max_wait=1.0)
    barrier("up")
    labels = np.concatenate([np.full(n, c, np.int64) for c, n in stream])
    np.random.default_rng(rank).shuffle(labels)
    items = np.stack([np.full(len(labels), rank, np.float64), np.arange(len(labels), dtype=np.float64)], 1)
    B = 20
    out = {"drawn": [], "mix_s": [], "stats": None}
    for i in range(0, len(labels), B):
        buf.mix(items[i:i + B], labels[i:i + B])
    barrier("streamed")
    x0, y0 = items[:1], labels[:1]
    buf.mix(x0, y0, ratio=0, add=False)  # fetches the packs every rank published after its stream
    buf.mix(x0, y0, ratio=0, add=False)
    for step in range(steps_after):
        if step == die_step and rank == die_rank:
            open(os.path.join(workdir, "dying"), "w").close()
            os.kill(os.getpid(), 9)  # this rank dies, its node with it
        if step == die_step:  # the others go on once it is gone
            while not os.path.exists(os.path.join(workdir, "dying")):
                time.sleep(0.01)
            time.sleep(0.3)
        t0 = time.perf_counter()
        x, y = buf.mix(x0, y0, ratio=40, add=False)
        out["mix_s"].append(time.perf_counter() - t0)
        x = np.asarray(x)[1:]
        out["drawn"] += [[int(a), int(b), int(c)] for (a, b), c in zip(x, np.asarray(y)[1:])]
    out["stats"] = buf.stats()
    out["shard"] = buf.shard  # shards are numbered by the nodes' addresses, not by rank
    out["n"] = len(labels)
    out["held"] = len(buf)
    print(json.dumps(out), flush=True)
    barrier("done", world if die_rank < 0 else world - 1)
    buf.close()
    cache.close()  # the node stops and removes its segments
""")


def run_ranks(workdir, streams, policy, capacity, steps_after, die=(-1, -1)):
    """Starts one process per stream; returns their outputs (None for a rank that died)."""
    world = len(streams)
    nodes = ",".join(f"127.0.0.1:{p}" for p in free_ports(world))
    procs = []
    for r, stream in enumerate(streams):
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(r), str(world), nodes, str(workdir), policy,
                                       str(capacity), str(steps_after), str(die[0]), str(die[1]), json.dumps(stream)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=300)
        if r == die[0]:
            assert p.returncode == -signal.SIGKILL, f"rank {r}: {err}"
            for seg in glob.glob(f"/dev/shm/vcache.{p.pid}.*"):  # what the killed node leaves
                os.unlink(seg)
            outs.append(None)
            continue
        assert p.returncode == 0, f"rank {r}: {err}"
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


@pytest.mark.parametrize("world", [2, 3])
def test_the_global_draw_is_one_reservoir_over_every_ranks_stream(tmp_path, world):
    # Rank r sees 600 * (r + 1) samples into a shard of the same size: a shard's samples stand for
    # many more of a fast rank's stream, so the draws must weight the shards by what they saw.
    streams = [[[0, 600 * (r + 1)]] for r in range(world)]
    outs = run_ranks(tmp_path, streams, "reservoir", 120 * world, steps_after=40)
    seen = np.array([o["n"] for o in outs], dtype=np.float64)
    drawn = [d for o in outs for d in o["drawn"]]
    assert len(drawn) == 40 * 40 * world
    by_rank = np.bincount([d[0] for d in drawn], minlength=world)
    stat = chi2(by_rank, seen / seen.sum())
    assert stat < CHI2_999[world - 1], (by_rank.tolist(), (seen / seen.sum()).tolist(), stat)
    # Broken alternatives fail this bound: equal weight per shard (held counts are equal here).
    assert chi2(by_rank, np.full(world, 1 / world)) > CHI2_999[world - 1] * 5
    # Uniform within each stream: the drawn items' positions spread over the whole stream (a
    # shard that kept its first or its latest samples would sit near 0 or 1).
    for r in range(world):
        pos = np.array([d[1] for d in drawn if d[0] == r]) / seen[r]
        assert abs(pos.mean() - 0.5) < 0.1, (r, pos.mean())
        quarters = np.bincount(np.minimum((pos * 4).astype(int), 3), minlength=4) / len(pos)
        assert (quarters > 0.12).all(), (r, quarters.tolist())
    for r, o in enumerate(outs):
        assert o["held"] == 120, "capacity spread evenly over the shards"
        st = o["stats"]
        assert st["remote_draws"] > 0 and st["local_draws"] > 0, st
        assert st["fetch_failures"] == 0 and st["live"] == list(range(world)), st


def test_class_balance_holds_over_all_ranks(tmp_path):
    # Rank 0 sees classes 0 and 1, rank 1 sees 0, 2 and a rare 3: one class-balanced buffer of 200
    # over both streams would hold 40 of class 3 (all it saw) and 53.3 of each other class.
    streams = [[[0, 2000], [1, 200]], [[0, 500], [2, 1000], [3, 40]]]
    outs = run_ranks(tmp_path, streams, "class_balanced", 200, steps_after=40)
    drawn = [d for o in outs for d in o["drawn"]]
    classes = np.bincount([d[2] for d in drawn], minlength=4)
    want = np.array([160 / 3, 160 / 3, 160 / 3, 40]) / 200
    stat = chi2(classes, want)
    assert stat < CHI2_999[3], (classes.tolist(), stat)
    # Each shard alone would draw its own classes equally, and the union of the shards' holdings
    # gives class 0 (held by both) far more than its share: both fail the bound.
    held_union = np.array([50 + 33.3, 50, 33.3, 33.3]) / 200
    assert chi2(classes, held_union) > CHI2_999[3] * 5
    # Within class 0, the shards in proportion to what each saw of it (2000 : 500).
    zero = np.bincount([d[0] for d in drawn if d[2] == 0], minlength=2)
    assert chi2(zero, [0.8, 0.2]) < CHI2_999[1], zero.tolist()
    for o in outs:
        assert o["stats"]["remote_draws"] > 0


def test_a_rank_that_dies_does_not_hang_mix(tmp_path):
    streams = [[[0, 400]], [[0, 400]], [[0, 400]]]
    outs = run_ranks(tmp_path, streams, "reservoir", 300, steps_after=30, die=(2, 10))
    live = sorted(outs[r]["shard"] for r in (0, 1))
    dead = ({0, 1, 2} - set(live)).pop()
    for r in (0, 1):
        o = outs[r]
        assert len(o["mix_s"]) == 30
        # A fetch of the dead shard fails (connection reset, or the cache's 2 s timeout); mix()
        # waits for it at most max_wait (1 s), then draws from the live shards. The wait is the
        # bound (0.5 s of it for the waiting thread's wake-up on two loaded CPUs: still short of
        # the 2 s a wait for the failed fetch would take); a mix() as a whole also shares two CPUs
        # with three ranks, so it only must not hang.
        assert o["stats"]["wait_max_seconds"] <= 1.0 + 0.5, o["stats"]
        assert max(o["mix_s"]) < 10.0, o["mix_s"]
        assert o["stats"]["live"] == live and str(dead) in o["stats"]["down"], o["stats"]
        assert {d[0] for d in o["drawn"][-40 * 5:]} == {0, 1}, "the dead shard is left out of the draws"


def test_pack_parser_names_each_fault():
    sb = 16
    good = rd.encode_pack({"shard": 1, "seq": 3, "seen": 5, "n": 2, "sample_bytes": sb, "class_seen": {"0": 5},
                           "class_held": {"0": 2}}, np.array([0, 0]), np.zeros((2, sb), np.uint8))
    p = rd.decode_pack(good, sb, 1)
    assert p["seen"] == 5 and p["class_seen"] == {0: 5} and p["samples"].shape == (2, sb)
    meta_len = struct.unpack_from("<I", good, 8)[0]

    def with_meta(**changes):
        meta = json.loads(good[12:12 + meta_len])
        meta.update(changes)
        return rd.encode_pack(meta, np.array([0, 0]), np.zeros((2, sb), np.uint8))

    cases = [
        (good[:5], "5 bytes: shorter than its 12-byte header"),
        (b"XXXX" + good[4:], "magic b'XXXX'"),
        (good[:4] + struct.pack("<I", 9) + good[8:], "version 9"),
        (good[:8] + struct.pack("<I", 1 << 30) + good[12:], "does not fit"),
        (good[:-1], "after the meta"),
        (good + b"x", "after the meta"),
        (with_meta(shard=0), "shard 0 where shard 1's pack was expected"),
        (with_meta(sample_bytes=8), "samples of 8 bytes, this buffer's are 16"),
        (with_meta(seen=-1), "seen=-1"),
        (with_meta(seen=6), "class_seen adds up to 5, seen is 6"),
        (with_meta(class_held={"0": 9}), "class 0: 9 held but 5 seen"),
        (with_meta(class_held={"0": 1}), "class 0: 2 samples in the pack but 1 held"),
        (with_meta(class_seen={"x": 5}), "label 'x': not an integer"),
        (with_meta(class_seen=[]), "class_seen is not an object"),
        (good[:12] + b"{" * meta_len + good[12 + meta_len:], "meta is not JSON"),
        # Nested past Python's recursion limit: before, a RecursionError instead of viper.Error.
        (good[:8] + struct.pack("<I", 200000) + b"[" * 100000 + b"]" * 100000 + good[12 + meta_len:],
         "meta is not JSON"),
    ]
    for data, message in cases:
        with pytest.raises(viper.Error, match="rehearsal pack: .*" + __import__("re").escape(message)):
            rd.decode_pack(data, sb, 1)


def test_planner_weights_shards_by_what_they_saw():
    rng = np.random.default_rng(3)
    packs = {s: {"seen": n, "class_seen": {0: n}, "class_held": {0: 10}, "labels": np.zeros(10, np.int64)}
             for s, n in ((0, 100), (1, 300), (2, 600))}
    counts = np.zeros(3)
    for _ in range(2000):
        for (s, _), n in rd.plan_draws(16, packs, "reservoir", 30, rng).items():
            counts[s] += n
    assert chi2(counts, [0.1, 0.3, 0.6]) < CHI2_999[2]
    assert rd.plan_draws(16, {}, "reservoir", 30, rng) == {}
    # A shard that holds nothing is never drawn from.
    packs[1]["labels"] = np.zeros(0, np.int64)
    assert all(s != 1 for s, _ in rd.plan_draws(64, packs, "reservoir", 30, rng))


def test_water_fill_is_one_class_balanced_buffer():
    assert rd.water_fill(200, {0: 2500, 1: 200, 2: 1000, 3: 40}) == pytest.approx({0: 160 / 3, 1: 160 / 3,
                                                                                   2: 160 / 3, 3: 40})
    assert rd.water_fill(10, {0: 3, 1: 3}) == {0: 3, 1: 3}
    assert rd.water_fill(9, {0: 100, 1: 100, 2: 100}) == {0: 3, 1: 3, 2: 3}


def test_ranks_may_list_the_nodes_in_any_order(tmp_path):
    """Two ranks listing the same two nodes in opposite orders draw from each other's shard.
    Before, each was shard 0 (its list index), and neither fetched the other's pack."""
    a, b = [f"127.0.0.1:{p}" for p in free_ports(2)]
    src = vd.callable_source(lambda i: np.full(2, i, np.float32).tobytes(), [8] * 100)
    caches = [vd.SampleCache(src, [a, b], 0, token="t"), vd.SampleCache(src, [b, a], 0, token="t")]
    bufs = [vd.DistributedRehearsalBuffer(40, cache=c, sample_shape=(2,), dtype="float32", max_wait=5.0)
            for c in caches]
    try:
        assert sorted(buf.state_dict()["shard"] for buf in bufs) == [0, 1]
        for step in range(20):
            for r, buf in enumerate(bufs):
                x = np.full((4, 2), 1000 * r + step, np.float32)
                buf.mix(x, np.full(4, r, np.int64))
        for r, buf in enumerate(bufs):
            st = buf.stats()
            assert st["remote_draws"] > 0 and st["live"] == [0, 1] and st["fetch_failures"] == 0, (r, st)
    finally:
        for buf in bufs:
            buf.close()
        for c in caches:
            c.close()


def test_class_balanced_draws_the_classes_a_shard_holds_few_of():
    """A shard holding 995 samples of class 0 and one of each of classes 1-5 draws the rare classes
    as a local class-balanced buffer does. Before, its pack took 2 x pack samples at random and
    kept the classes among them, so the rare ones were seldom in it: 0 of 50,000 draws here
    (the local buffer: about 250)."""
    node = f"127.0.0.1:{free_ports(1)[0]}"
    cache = vd.SampleCache(vd.callable_source(lambda i: bytes(8), [8]), [node], 0, token="t")
    buf = vd.DistributedRehearsalBuffer(1000, cache=cache, sample_shape=(2,), dtype="float32",
                                        policy="class_balanced", max_wait=0.0)
    local = vd.RehearsalBuffer(1000, sample_shape=(2,), dtype="float32", policy="class_balanced")
    try:
        for c in range(1, 6):
            buf.mix(np.zeros((1, 2), np.float32), np.array([c]), ratio=0)
            local.add(np.zeros((1, 2), np.float32), np.array([c]))
        for _ in range(40):
            buf.mix(np.zeros((500, 2), np.float32), np.zeros(500, np.int64), ratio=0)
            local.add(np.zeros((500, 2), np.float32), np.zeros(500, np.int64))
        rare = sum(int(np.sum(buf.sample(50, as_numpy=True)[1] > 0)) for _ in range(1000))
        rare_local = sum(int(np.sum(local.sample(50, as_numpy=True)[1] > 0)) for _ in range(1000))
        assert 150 < rare < 400 and 150 < rare_local < 400, (rare, rare_local)
    finally:
        buf.close()
        local.close()
        cache.close()


def test_arguments_are_checked(tmp_path):
    src = vd.callable_source(lambda i: bytes(8), [8])
    nodes = [f"127.0.0.1:{p}" for p in free_ports(2)]
    with pytest.raises(TypeError, match="expected a viper.data.SampleCache"):
        vd.DistributedRehearsalBuffer(10, cache=object(), sample_shape=(2,))
    cache = vd.SampleCache(src, nodes, 0, token="t", timeout=0.2)
    try:
        with pytest.raises(viper.InvalidArgumentError, match=r"capacity=1: must be an int from 2"):
            vd.DistributedRehearsalBuffer(1, cache=cache, sample_shape=(2,))
        with pytest.raises(viper.InvalidArgumentError, match="policy='fifo'"):
            vd.DistributedRehearsalBuffer(10, cache=cache, sample_shape=(2,), policy="fifo")
        with pytest.raises(viper.InvalidArgumentError, match="key='a.b' must be"):
            vd.DistributedRehearsalBuffer(10, cache=cache, sample_shape=(2,), key="a.b")
        buf = vd.DistributedRehearsalBuffer(10, cache=cache, sample_shape=(2,), dtype="float32", max_wait=0.0,
                                            spill_dir=tmp_path)
        assert buf.local.capacity == 5
        x, y = buf.mix(np.ones((4, 2), np.float32), np.zeros(4, np.int64))
        assert len(x) == 4 and len(buf) == 4  # nothing held yet: nothing drawn
        x, y = buf.mix(np.ones((4, 2), np.float32), np.zeros(4, np.int64))
        assert len(x) == 6
        st = buf.state_dict()
        mine = sorted(nodes).index(nodes[0])  # shards are numbered by address
        assert st["shard"] == mine and st["shards"] == 2 and st["capacity"] == 10 and len(st["labels"]) == 5
        buf.spill()
        assert os.path.exists(tmp_path / f"shard-{mine}" / "rehearsal.vrec")
        with pytest.raises(viper.InvalidArgumentError, match=f"state shard={1 - mine}: this buffer's is {mine}"):
            buf.load_state_dict(dict(st, shard=1 - mine))
        buf.load_state_dict(st)
        buf.close()
        again = vd.DistributedRehearsalBuffer(10, cache=cache, sample_shape=(2,), dtype="float32", max_wait=0.0,
                                              spill_dir=tmp_path)
        assert len(again) == 5 and again.seen == 8, "the shard restored from its spill"
        again.close()
        # The cache closed under a buffer still open: a clear error (before, a segfault: the
        # binding raised its error without the GIL).
        late = vd.DistributedRehearsalBuffer(10, cache=cache, sample_shape=(2,), dtype="float32", max_wait=0.0)
        cache.close()
        for call in (lambda: late.mix(np.ones((4, 2), np.float32), np.zeros(4, np.int64)),
                     lambda: cache._cache.put_object("k", b"x"), lambda: cache._cache.get_object(1, "k")):
            with pytest.raises(viper.Error, match="SampleCache is closed"):
                call()
        late.close()
        with pytest.raises(viper.Error, match=r"sample\(\): the buffer is closed"):
            late.sample(2)  # before, it went on drawing from the packs it held
    finally:
        cache.close()
