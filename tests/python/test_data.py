"""viper.data (python/viper/data.py, python/src/data_bindings.cc): the prefetcher as a torch
IterableDataset and as a DataLoader drop-in, zero-copy samples, bad files, record files, and the
rehearsal buffer with spill and restore. Real files in a temporary directory, real threads.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_data.py
"""
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import viper
import viper.data as vd

CLASSES, PER_CLASS, WIDTH = 3, 40, 64  # samples are WIDTH float32 values, all equal to the sample's id


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    for c in range(CLASSES):
        (root / f"class{c}").mkdir()
        for k in range(PER_CLASS):
            np.full(WIDTH, c * PER_CLASS + k, dtype=np.float32).tofile(root / f"class{c}" / f"{k:04d}.bin")
    return root


def sample_id(x):
    return int(x.view(torch.float32)[0]) if isinstance(x, torch.Tensor) else int(x.view(np.float32)[0])


def test_source_ids_labels_and_read(tree):
    src = vd.open_source(tree)
    assert len(src) == CLASSES * PER_CLASS
    assert src.class_names == ["class0", "class1", "class2"]
    assert src.label(PER_CLASS + 1) == 1 and src.nbytes(0) == 4 * WIDTH
    assert sample_id(src.read(7)) == 7
    assert src.describe(7).startswith("sample 7 (") and src.describe(7).endswith("0007.bin)")
    with pytest.raises(IndexError):
        src.read(10_000)
    with pytest.raises(viper.NotFoundError):
        vd.open_source(tree / "missing")


def test_prefetcher_epochs_and_zero_copy(tree):
    with vd.Prefetcher(tree, epochs=2, seed=3) as p:
        orders = []
        for _ in range(2):
            seen = []
            for array, label, sid in p:
                assert sample_id(array) == sid and label == sid // PER_CLASS
                assert array.dtype == np.uint8 and array.flags.writeable
                assert array.ctypes.data % 64 == 0
                t = torch.from_numpy(array)
                assert t.data_ptr() == array.ctypes.data  # torch shares the prefetcher's buffer
                seen.append(sid)
            assert sorted(seen) == list(range(CLASSES * PER_CLASS))
            orders.append(seen)
        assert orders[0] != orders[1]
        assert p.finished and p.next() is None
        assert p.stats()["delivered"] == 2 * CLASSES * PER_CLASS


def test_iterable_dataset_with_torch_dataloader(tree):
    ds = vd.PrefetchDataset(tree, transform=lambda a, label: (torch.from_numpy(a).view(torch.float32), label))
    for workers in (0, 2):
        loader = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=workers)
        for _ in range(2):  # two epochs
            ids, labels = [], []
            for x, y in loader:
                assert x.shape[1:] == (WIDTH,)
                ids += [int(v) for v in x[:, 0]]
                labels += y.tolist()
            assert sorted(ids) == list(range(CLASSES * PER_CLASS)), f"num_workers={workers}"
            assert all(label == i // PER_CLASS for i, label in zip(ids, labels))
    ds.close()


def test_an_empty_selection_reads_no_samples(tree):
    """ids=[] is refused (before, it read every sample: the C++ prefetcher's "empty: all"), and
    torch workers beyond the samples read none (before, each read the whole source)."""
    for make in (lambda: vd.Prefetcher(tree, ids=[]), lambda: vd.PrefetchDataset(tree, ids=[]),
                 lambda: vd.DataLoader(tree, batch_size=4, ids=[])):
        with pytest.raises(viper.InvalidArgumentError, match=r"ids=\[\] selects no samples \(ids=None reads every"):
            make()
    ds = vd.PrefetchDataset(tree, ids=[77], transform=lambda a, label: torch.from_numpy(a).view(torch.float32))
    loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=2)  # the second worker has none
    assert sorted(int(x[0, 0]) for x in loader) == [77]
    ds.close()


def test_dataloader_drop_in(tree):
    n = CLASSES * PER_CLASS
    with vd.DataLoader(tree, batch_size=32, batch_transform=lambda x: x.view(torch.float32)) as dl:
        assert len(dl) == 4
        for _ in range(2):
            batches = list(dl)
            assert [len(b[0]) for b in batches] == [32, 32, 32, 24]
            x = torch.cat([b[0] for b in batches])
            assert x.dtype == torch.float32 and sorted(int(v) for v in x[:, 0]) == list(range(n))
            assert batches[0][1].dtype == torch.int64
    dl = vd.DataLoader(tree, batch_size=32, drop_last=True)
    assert len(dl) == 3
    for _ in range(2):
        assert [len(x) for x, _ in dl] == [32, 32, 32]
    # A loop that breaks out: the next loop is a whole new epoch, as with torch's DataLoader.
    for _ in dl:
        break
    assert sum(len(x) for x, _ in dl) == 96
    dl.close()
    # Per-sample transform and torch's default collate.
    dl = vd.DataLoader(tree, batch_size=10, shuffle=False, ordered=True,
                       transform=lambda a, label: {"x": torch.from_numpy(a).view(torch.float32), "y": label})
    first = next(iter(dl))
    assert first["x"].shape == (10, WIDTH) and first["y"].tolist() == [0] * 10
    assert [int(v) for v in first["x"][:, 0]] == list(range(10))
    del dl
    gc.collect()  # a loader dropped mid-epoch closes its readers


# A script whose readers call Python (a callable source) and that ends its prefetcher without
# close(): the way it ends is the last line, after one sample was read.
ENDS_WITHOUT_CLOSE = textwrap.dedent(r"""
    import sys, time
    import viper.data as vd
    from viper import _viper

    def read(i):
        time.sleep(0.001)  # releases the GIL, which the reader then takes back
        return bytes(64)

    source = vd.callable_source(read, [64] * 5000)
""")


@pytest.mark.parametrize("ending", [
    # at exit, open: before, the finalizing interpreter ended a reader inside read() and the
    # process aborted ("Fatal Python error: drop_gil: GIL is not locked")
    "pf = vd.Prefetcher(source); pf.next(); print('read', flush=True)",
    "loader = vd.DataLoader(source, batch_size=8); next(iter(loader)); print('read', flush=True)",
    # collected without close(): before, its readers were joined holding the GIL they waited for
    "impl = _viper._Prefetcher(source._impl, _viper._PrefetchOptions(), []); impl.next(); del impl; "
    "print('read', flush=True)",
], ids=["prefetcher-at-exit", "dataloader-at-exit", "collected"])
def test_readers_calling_python_end_cleanly_without_close(ending):
    p = subprocess.run([sys.executable, "-c", ENDS_WITHOUT_CLOSE + ending], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stdout == "read\n", (p.returncode, p.stdout, p.stderr[-2000:])


def test_bad_files_fail_or_skip(tmp_path):
    for k in range(20):
        np.full(WIDTH, k, dtype=np.float32).tofile(tmp_path / f"{k:02d}.bin")
    src = vd.open_source(tmp_path, labels_from_subdirs=False, sample_bytes=4 * WIDTH)
    (tmp_path / "05.bin").write_bytes(b"short")  # after the scan: truncated
    with vd.Prefetcher(src, shuffle=False, ordered=True) as p:
        with pytest.raises(viper.InvalidArgumentError, match=r"sample 5 \(.*05\.bin\): truncated") as err:
            for _ in p:
                pass
        assert isinstance(err.value, ValueError)
    with vd.Prefetcher(src, on_error="skip", epochs=2) as p:
        assert sum(1 for _ in p) == 19 and sum(1 for _ in p) == 19
        stats = p.stats()
        assert stats["skipped"] == 2 and "05.bin" in stats["last_skip_error"]
    with pytest.raises(viper.InvalidArgumentError, match="on_error must be 'fail' or 'skip'"):
        vd.Prefetcher(src, on_error="ignore")
    with pytest.raises(TypeError, match="unexpected keyword argument 'reader'"):
        vd.Prefetcher(src, reader=3)


def test_record_file_source(tmp_path):
    path = tmp_path / "train.vrec"
    n = vd.write_records(path, ((np.full(WIDTH, i, dtype=np.float32), i % 4) for i in range(100)))
    assert n == 100
    src = vd.open_source(path)
    assert len(src) == 100 and src.label(7) == 3
    with vd.Prefetcher(src, readers=3) as p:
        batch = p.next_batch(100)
        data, labels, ids = batch
        assert data.shape == (100, 4 * WIDTH)
        assert all(sample_id(data[i]) == ids[i] and labels[i] == ids[i] % 4 for i in range(100))
        assert p.next_batch(10) is None
    with pytest.raises(TypeError, match="apply to a directory"):
        vd.open_source(path, sample_bytes=4)


def test_rehearsal_mix_balance_and_restore(tmp_path):
    spill = tmp_path / "rehearsal"
    buf = vd.RehearsalBuffer(30, sample_shape=(WIDTH,), dtype=torch.float32, ratio=0.5, policy="class_balanced",
                             spill_dir=spill, seed=1)
    x0 = torch.zeros(32, WIDTH)
    mixed_x, mixed_y = buf.mix(x0, torch.zeros(32, dtype=torch.int64))
    assert mixed_x.shape == (32, WIDTH), "nothing to rehearse yet"
    for label in (1, 2):
        x = torch.full((32, WIDTH), float(label))
        mixed_x, mixed_y = buf.mix(x, torch.full((32,), label))
        assert mixed_x.shape == (48, WIDTH) and mixed_y.shape == (48,)
        old = mixed_y[32:]
        assert all(int(v) < label for v in old), "rehearsal samples come from earlier batches"
        assert torch.equal(mixed_x[32:, 0], old.to(torch.float32))
    assert buf.class_counts == {0: 10, 1: 10, 2: 10} and buf.seen == 96
    buf.spill()
    assert os.path.exists(buf.spill_path)
    buf.close()
    again = vd.RehearsalBuffer(30, sample_shape=(WIDTH,), dtype="float32", policy="class_balanced", spill_dir=spill)
    assert again.class_counts == {0: 10, 1: 10, 2: 10} and again.seen == 96
    x, y = again.sample(30, as_numpy=True)
    assert x.shape == (30, WIDTH) and np.array_equal(x[:, 0], y.astype(np.float32))
    with pytest.raises(viper.InvalidArgumentError, match="written with policy class_balanced"):
        vd.RehearsalBuffer(30, sample_shape=(WIDTH,), spill_dir=spill)
    with pytest.raises(viper.InvalidArgumentError, match="samples of shape"):
        again.add(np.zeros((2, 3), np.float32), [0, 1])


HOLD = r": the buffer's dtype (\w+) cannot hold it exactly"


@pytest.mark.parametrize("dtype,x,y,message", [
    ("uint8", np.array([[0.2, 0.9]]), [0], r"x\[0, 0\]=0.2" + HOLD + r" \(it would be stored as 0\)"),
    ("uint8", np.array([[1, 300], [-1, 256]]), [0, 1], r"x\[0, 1\]=300" + HOLD),
    ("uint8", torch.tensor([[1, -1]]), [0], r"x\[0, 1\]=-1" + HOLD),
    ("int32", np.array([[1.0, np.nan]]), [0], r"x\[0, 1\]=nan" + HOLD),
    ("float16", np.array([[1.0, 1e6]]), [0], r"x\[0, 1\]=1000000.0" + HOLD + r" \(it would be stored as inf\)"),
    ("float32", np.zeros((2, 2), np.float32), [1, 1.7], r"y\[1\]=1.7: a label must be an integer"),
    ("float32", np.zeros((1, 2), np.float32), torch.tensor([0.5]), r"y\[0\]=0.5: a label must be an integer"),
    ("float32", np.zeros((1, 2), np.float32), [2**63], r"y\[0\]=9223372036854775808: a label must fit in int64"),
], ids=["fraction", "over", "negative", "nan", "float-overflow", "label", "torch-label", "label-range"])
def test_rehearsal_add_refuses_values_the_buffer_cannot_hold(dtype, x, y, message):
    """add() cast silently: 0.2 and 0.9 were stored as 0 in a uint8 buffer, [300, -1, 256] as
    [44, 255, 0], label 1.7 as 1. Nothing is added when a value is refused."""
    buf = vd.RehearsalBuffer(8, sample_shape=(2,), dtype=dtype)
    with pytest.raises(viper.InvalidArgumentError, match=r"RehearsalBuffer.add\(\): " + message):
        buf.add(x, y)
    assert len(buf) == 0 and buf.seen == 0
    with pytest.raises(TypeError, match=r"y\[0\]='1': expected an integer label, got str"):
        buf.add(np.zeros((1, 2)), ["1"])
    buf.close()


def test_rehearsal_add_takes_what_the_buffer_holds_exactly():
    ints = vd.RehearsalBuffer(8, sample_shape=(2,), dtype="uint8", seed=3)
    ints.add(np.array([[0, 255]], np.int64), np.array([1]))           # ints in range
    ints.add(torch.tensor([[1.0, 2.0]]), torch.tensor([2.0]))        # integral floats, a float label of an integer
    ints.add([[True, False]], [3])                                   # bools, a list
    x, y = ints.sample(8, as_numpy=True)
    assert sorted(map(tuple, x.tolist())) == [(0, 255), (1, 0), (1, 2)] and sorted(y.tolist()) == [1, 2, 3]
    floats = vd.RehearsalBuffer(8, sample_shape=(2,), dtype="float32", seed=3)
    floats.add(np.array([[0.1, -1e30]]), [0])                        # float64 rounds to float32
    floats.add(np.array([[np.nan, np.inf]], np.float32), [1])       # the same dtype: taken as it is
    floats.add(torch.randn(3, 2), torch.tensor([1, 2, 3]))
    assert len(floats) == 5
    ints.close()
    floats.close()


def test_rehearsal_mix_refuses_labels_of_another_length():
    """mix(add=False) returned x of 7 rows and y of 4."""
    buf = vd.RehearsalBuffer(8, sample_shape=(1,), ratio=1.0)
    buf.add(np.zeros((4, 1), np.float32), [0, 1, 2, 3])
    for add in (False, True):
        with pytest.raises(viper.InvalidArgumentError, match=r"mix\(\): 7 samples in x but 4 labels in y"):
            buf.mix(np.ones((7, 1), np.float32), np.zeros(4, np.int64), add=add)
    assert buf.seen == 4
    x, y = buf.mix(torch.ones(3, 1), torch.zeros(3, dtype=torch.int64), add=False)
    assert x.shape == (6, 1) and y.shape == (6,)
    buf.close()


def test_rehearsal_buffer_closed_while_another_thread_uses_it():
    # close() on one thread while another adds and draws (both release the GIL): the calls hold
    # their own reference, so the buffer is never freed under one; the other thread gets "closed".
    code = (
        "import threading, numpy as np, viper.data as vd\n"
        "for round in range(5):\n"
        "    buf = vd.RehearsalBuffer(2000, sample_shape=(4096,))\n"
        "    x = np.ones((256, 4096), np.float32)\n"
        "    y = np.arange(256)\n"
        "    done, errors = [], []\n"
        "    def use():\n"
        "        while True:\n"
        "            try:\n"
        "                buf.add(x, y)\n"
        "                buf.sample(512)\n"
        "                done.append(1)\n"
        "            except Exception as e:\n"
        "                errors.append(f'{type(e).__name__}: {e}')\n"
        "                return\n"
        "    t = threading.Thread(target=use)\n"
        "    t.start()\n"
        "    while len(done) < 3:\n"
        "        pass\n"
        "    buf.close()\n"
        "    t.join()\n"
        "    assert len(errors) == 1 and 'closed' in errors[0], errors\n"
        "    print('ROUND', round, errors[0])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.count("ROUND ") == 5, out.stdout + out.stderr
