"""viper.data across data-parallel ranks (python/viper/data.py DataLoader(rank, world_size,
cache_nodes), include/viper/sample_cache.h): real rank processes, each with its own cache node on
loopback and its own DataLoader, in step per epoch as training ranks are (a file barrier stands for
the all-reduce). Every sample once per epoch across the ranks, the bytes right, the source read
only in the first epoch (a node that dies: tests/data/sample_cache_test.cc).

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_data_cache.py
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import viper
import viper.data as vd
from helpers import free_ports, id_sample_tree

N, WIDTH = 240, 256  # samples of WIDTH float32 values, all equal to the sample's id

RANK = textwrap.dedent(r"""
    import json, os, sys, time
    import numpy as np
    import viper.data as vd
    tree, rank, world, nodes, workdir, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(","), sys.argv[5], int(sys.argv[6])

    def barrier(name, count):
        open(os.path.join(workdir, f"{name}.{rank}"), "w").close()
        deadline = time.time() + 60
        while sum(os.path.exists(os.path.join(workdir, f"{name}.{r}")) for r in range(count)) < count:
            if time.time() > deadline:
                sys.exit(f"rank {rank}: barrier {name} timed out")
            time.sleep(0.01)

    # autotune off: the read-ahead stays at its 16 samples, the bound on the first epochs' reads below
    loader = vd.DataLoader(tree, batch_size=16, rank=rank, world_size=world, seed=5, cache_nodes=nodes,
                           cache_token="t0ken", cache_options={"name": "cifar"}, autotune=False)
    barrier("up", world)  # every node listens before any rank reads
    out = {"epochs": [], "source_bytes": []}
    for epoch in range(epochs):
        ids = []
        for x, y in loader:
            v = x.view(dtype=__import__("torch").float32).reshape(len(x), -1).numpy()
            assert (v == v[:, :1]).all(), "a sample's bytes are its id"
            ids += [int(i) for i in v[:, 0]]
        out["epochs"].append(ids)
        out["source_bytes"].append(loader.stats()["source_bytes"])
        barrier(f"epoch{epoch}", world)
    st = loader.stats()
    out["epoch_samples"] = st["epoch_samples"]
    out["cache"] = st["cache"]
    print(json.dumps(out), flush=True)
    barrier("done", world)  # no node goes away while another rank may still ask it
    loader.close()
""")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return id_sample_tree(tmp_path_factory.mktemp("tree"), N, WIDTH)


def run_ranks(tree, workdir, world, epochs):
    nodes = ",".join(f"127.0.0.1:{p}" for p in free_ports(world))
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(tree), str(r), str(world), nodes, str(workdir),
                               str(epochs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = []
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, f"rank {r}: {err}"
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_share_epochs_and_read_the_source_once(tree, tmp_path, world):
    epochs = 3
    outs = run_ranks(tree, tmp_path, world, epochs)
    for e in range(epochs):
        ids = sorted(i for o in outs for i in o["epochs"][e])
        assert ids == list(range(N)), f"epoch {e}: every sample exactly once across the ranks"
        for r, o in enumerate(outs):
            assert len(o["epochs"][e]) in (N // world, -(-N // world)), (r, e)
    for r, o in enumerate(outs):
        assert o["epoch_samples"] == [len(ids) for ids in o["epochs"]]
        # The source is read in the first epoch only (and by the readers reading ahead into the
        # second before the other ranks had cached what they read): afterwards every sample is in
        # some node.
        assert o["source_bytes"][1] == o["source_bytes"][2], (r, o["source_bytes"])
    nbytes = WIDTH * 4
    first = sum(o["source_bytes"][1] for o in outs)
    assert N * nbytes <= first <= (N + world * 16) * nbytes, first  # 16: the readers' start-up buffer
    caches = [o["cache"] for o in outs]
    assert sum(c["node_samples"] for c in caches) == N, "each sample cached in exactly one node"
    assert (epochs - 1) * N - world * 16 <= sum(c["local_hits"] + c["remote_hits"] for c in caches)
    assert sum(c["remote_hits"] for c in caches) > 0
    assert all(c["put_failures"] == 0 and c["peer_failures"] == 0 for c in caches), caches


def test_loader_arguments_are_checked(tree):
    with pytest.raises(viper.InvalidArgumentError, match=r"rank=3 .*must be .*2|rank"):
        vd.DataLoader(tree, rank=3, world_size=2)
    with pytest.raises(viper.InvalidArgumentError, match=r"cache_nodes=\[\]|nodes=\[\]"):
        vd.DataLoader(tree, cache_nodes=[])
    with pytest.raises(TypeError, match="need cache_nodes"):
        vd.DataLoader(tree, cache_token="x")
    with pytest.raises(viper.InvalidArgumentError, match="must be HOST:PORT"):
        vd.DataLoader(tree, cache_nodes=["localhost"])
    with pytest.raises(viper.InvalidArgumentError, match="rank=1 but cache_nodes has 1 entries"):
        vd.DataLoader(tree, rank=1, world_size=2, cache_nodes=["127.0.0.1:1"])


def test_single_process_loader_reports_source_bytes_and_epoch_samples(tree):
    loader = vd.DataLoader(tree, batch_size=50)
    for _ in range(2):
        for _ in loader:
            pass
    st = loader.stats()
    assert st["epoch_samples"] == [N, N]
    # No cache: every epoch reads the source (and the readers read ahead into the next one).
    assert 2 * N * WIDTH * 4 <= st["source_bytes"] <= (2 * N + 16) * WIDTH * 4
    assert st["source_bytes"] == st["bytes_read"]
    assert "cache" not in st
    loader.close()


def test_rank_share_of_a_single_process_loader(tree):
    seen = []
    for r in range(3):
        loader = vd.DataLoader(tree, batch_size=7, rank=r, world_size=3, seed=9)
        assert len(loader) == -(-(N // 3) // 7)
        seen += [int(i) for x, _ in loader for i in x.view(dtype=__import__("torch").float32).reshape(len(x), -1)[:, 0]]
        loader.close()
    assert sorted(seen) == list(range(N))


def test_sample_owner_matches_the_caches_choice():
    nodes = ["10.0.0.1:7500", "10.0.0.2:7500", "10.0.0.3:7500"]
    owners = [vd.sample_owner(i, nodes) for i in range(3000)]
    assert [owners.count(k) for k in range(3)] == pytest.approx([1000, 1000, 1000], abs=120)
    assert owners == [2 - vd.sample_owner(i, list(reversed(nodes))) for i in range(3000)], "order does not matter"


def test_callable_source_reads_through_python_and_names_bad_samples():
    calls = []

    def read(i):
        calls.append(i)
        return np.full(WIDTH, i, dtype=np.float32).tobytes() if i != 5 else b"short"

    src = vd.callable_source(read, [WIDTH * 4] * 20, labels=[i % 2 for i in range(20)], name="http test")
    assert len(src) == 20 and src.label(3) == 1 and src.describe(4) == "sample 4 (http test)"
    loader = vd.DataLoader(src, batch_size=4, ids=[i for i in range(20) if i != 5])
    got = sorted(int(v) for x, _ in loader for v in x.view(dtype=__import__("torch").float32).reshape(len(x), -1)[:, 0])
    assert got == [i for i in range(20) if i != 5]
    loader.close()
    with pytest.raises(viper.Error, match=r"sample 5 \(http test\): read returned 5 bytes, expected 1024"):
        src.read(5)
    with pytest.raises(TypeError, match="cannot be pickled"):
        __import__("pickle").dumps(src)


JOB = textwrap.dedent(r"""
    import glob, json, os, sys, time
    import viper.data as vd
    tree, job, jobs, node, workdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]

    def barrier(name):
        open(os.path.join(workdir, f"{name}.{job}"), "w").close()
        while sum(os.path.exists(os.path.join(workdir, f"{name}.{j}")) for j in range(jobs)) < jobs:
            time.sleep(0.01)

    # Job 0 runs this host's cache node; the others attach to it (jobs of a search on one data set).
    loader = vd.DataLoader(tree, batch_size=16, seed=job, cache_nodes=[node], cache_token="t0ken",
                           cache_options={"start_node": job == 0, "name": "search"})
    barrier("up")
    source = []
    for epoch in range(2):
        n = sum(len(x) for x, _ in loader)
        assert n == 240, n
        source.append(loader.stats()["source_bytes"])
        barrier(f"e{epoch}")
    st = loader.stats()
    shm = sum(os.path.getsize(p) for p in glob.glob(f"/dev/shm/vcache.{os.getpid()}.*")) if job == 0 else 0
    print(json.dumps({"source": source, "cache": st["cache"], "shm": shm}), flush=True)
    barrier("done")
    loader.close()
""")


def run_jobs(tree, workdir, jobs):
    node = f"127.0.0.1:{free_ports(1)[0]}"
    procs = [subprocess.Popen([sys.executable, "-c", JOB, str(tree), str(j), str(jobs), node, str(workdir)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for j in range(jobs)]
    outs = []
    for j, p in enumerate(procs):
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, f"job {j}: {err}"
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def test_four_processes_on_one_host_share_one_cache(tree, tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "four").mkdir()
    (alone,) = run_jobs(tree, tmp_path / "one", 1)
    four = run_jobs(tree, tmp_path / "four", 4)
    nbytes = WIDTH * 4
    assert alone["cache"]["node_samples"] == N and four[0]["cache"]["node_samples"] == N
    # One copy of the data set in the host's shared memory, however many processes use it.
    assert 0 < four[0]["shm"] <= 1.2 * alone["shm"], (four[0]["shm"], alone["shm"])
    assert four[0]["cache"]["node_bytes"] <= 1.2 * alone["cache"]["node_bytes"]
    for j, o in enumerate(four):
        assert o["source"][1] == o["source"][0], (j, o["source"])  # nothing from the source after epoch 1
        if j > 0:
            assert o["cache"]["node_samples"] == 0 and o["cache"]["local_hits"] >= N, o["cache"]
    # The jobs start together, so some samples are read by two before one of them cached it.
    assert N * nbytes <= sum(o["source"][0] for o in four) <= 4 * N * nbytes


def test_a_rank_that_breaks_out_of_an_epoch_keeps_the_ranks_common_order(tree):
    f32 = __import__("torch").float32

    def ids(batch):
        return {int(v) for v in batch[0].view(dtype=f32).reshape(len(batch[0]), -1)[:, 0]}

    whole = vd.DataLoader(tree, batch_size=8, rank=0, world_size=2, seed=11)
    broken = vd.DataLoader(tree, batch_size=8, rank=0, world_size=2, seed=11)
    want = [set().union(*(ids(b) for b in whole)) for _ in range(3)]
    assert set().union(*(ids(b) for b in broken)) == want[0]
    for b in broken:  # epoch 1 left after one batch
        break
    # Epoch 2 is the ranks' epoch 2, so rank 1 (which did not break) still gets the other half.
    assert set().union(*(ids(b) for b in broken)) == want[2]
    assert want[2] != want[1]
    whole.close()
    broken.close()


def test_close_frees_the_cache_nodes_shared_memory(tree):
    def segments():
        return [f for f in os.listdir("/dev/shm") if f.startswith("vcache") and f".{os.getpid()}." in f]

    loader = vd.DataLoader(tree, batch_size=16, rank=0, world_size=1, seed=3, cache_nodes=["127.0.0.1:0"],
                           cache_token="t0ken")
    for _ in loader:
        pass
    held = segments()
    assert len(held) > 0, "the node holds the samples it cached in shared memory"
    loader.close()
    assert segments() == [], f"close() stops the node: {len(segments())} of {len(held)} segments left"
