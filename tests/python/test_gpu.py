"""viper.Subscriber(device=N) and load_into on machines without a GPU (the GPU path itself is
tested by tests/gpu/gpu_test.cc on a machine with one): the device argument's checks, the clear
error when no CUDA driver is there, a CPU consumer that keeps the host path (version.device is
None, load_into copies from host memory), and version.device of a Subscriber(device=0) on the CUDA
driver emulator of the build tree (host memory, not a GPU)."""
import os
import subprocess
import sys

import pytest
import torch

import viper


NO_DRIVER = "/nonexistent/libcuda.so.1"


def _run_child(code, driver, *args):
    """Runs `code` in a child process whose CUDA driver library is `driver` (the driver is probed
    once per process, so a test that needs another one than this process's runs a child); returns
    its completed process, which must have exited 0."""
    env = dict(os.environ, VIPER_CUDA_LIBRARY=driver)
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


@pytest.fixture
def pub():
    p = viper.Publisher("m", listen="127.0.0.1:0", mode="sync")
    yield p
    p.close()


@pytest.mark.parametrize("bad", [-1, True, "cpu", "cuda:x", 1.5, torch.device("cpu")])
def test_device_argument_is_checked(pub, bad):
    with pytest.raises(ValueError, match=r"viper.Subscriber\(\): device="):
        viper.Subscriber("m", connect=pub.address, device=bad)


def test_device_and_gpu_device_together_are_refused(pub):
    with pytest.raises(ValueError, match="give device= or gpu_device=, not both"):
        viper.Subscriber("m", connect=pub.address, device=0, gpu_device=0)


def test_gpu_in_place_needs_a_device(pub):
    with pytest.raises(ValueError, match="gpu_in_place needs gpu_device >= 0"):
        viper.Subscriber("m", connect=pub.address, gpu_in_place=True)


def test_a_device_without_a_cuda_driver_is_a_clear_unavailable_error():
    # In a child process: the driver is probed once per process, and here it must be absent
    # whatever this machine has.
    code = (
        "import viper\n"
        "p = viper.Publisher('m', listen='127.0.0.1:0')\n"
        "try:\n"
        "    viper.Subscriber('m', connect=p.address, device='cuda:0')\n"
        "except viper.ViperIOError as e:\n"
        "    print('REFUSED', e)\n"
        "p.close()\n")
    out = _run_child(code, NO_DRIVER)
    assert "REFUSED Unavailable: SubscriberOptions::gpu_device 0: GPU: " in out.stdout, out.stdout
    assert "/nonexistent/libcuda.so.1" in out.stdout, out.stdout


def test_a_cpu_consumer_keeps_the_host_path(pub):
    producer = torch.nn.Linear(16, 4)
    consumer = torch.nn.Linear(16, 4)
    with viper.Subscriber("m", connect=pub.address) as sub:
        pub.publish(producer.state_dict(), step=3)
        version = sub.wait_for(1, timeout=30)
        assert version.device is None
        offsets = version._offsets()
        assert set(offsets) == {"weight", "bias"}
        assert offsets["weight"][1] == 16 * 4 * 4 and offsets["bias"][1] == 4 * 4
        sub.load_into(consumer)
        assert torch.equal(consumer.weight, producer.weight) and torch.equal(consumer.bias, producer.bias)


def test_gpu_early_needs_a_device(pub):
    with pytest.raises(ValueError, match="gpu_early needs gpu_device >= 0"):
        viper.Subscriber("m", connect=pub.address, gpu_early=True)


def test_only_cuda_tensors_on_one_device_take_the_gpu_publish_path():
    from viper import _tensors
    assert _tensors.cuda_entries({"w": torch.zeros(3)}) is None  # CPU tensors: the host path
    assert _tensors.cuda_entries({}) is None
    import numpy as np
    assert _tensors.cuda_entries({"w": np.zeros(3, dtype=np.float32)}) is None


def test_publishing_cuda_tensors_without_a_driver_is_a_clear_unavailable_error():
    # The extension's GPU publish (what Publisher.publish calls for CUDA tensors), in a child
    # process without a driver: GpuPublisher cannot start, nothing is published.
    code = (
        "import viper\n"
        "from viper import _viper\n"
        "p = viper.Publisher('m', listen='127.0.0.1:0')\n"
        "try:\n"
        "    p._live().publish_device([('w', 'F32', [4], 4096)], 0, 0, 1, None)\n"
        "except viper.ViperIOError as e:\n"
        "    print('REFUSED', e)\n"
        "print('ANNOUNCED', p.announced_version)\n"
        "p.close()\n")
    out = _run_child(code, NO_DRIVER)
    assert "REFUSED Unavailable: GPU: " in out.stdout, out.stdout
    assert "/nonexistent/libcuda.so.1" in out.stdout, out.stdout
    assert "ANNOUNCED 0" in out.stdout, out.stdout


# ---- zero-copy GPU publish: Publisher.begin_cuda ----------------------------------------------

@pytest.mark.parametrize("tensors, error, match", [
    ([("w", ((4,), "F32"))], TypeError, r"tensors=.*expected a mapping name -> \(shape, dtype\)"),
    ({}, viper.InvalidArgumentError, r"tensors=\{\}: must name at least one tensor"),
    ({1: ((4,), "F32")}, TypeError, "tensor names must be str, got int"),
    ({"w": (4,)}, TypeError, r"tensor 'w': .*expected \(shape, dtype\) or a torch tensor"),
    ({"w": (4, "F32")}, TypeError, r"tensor 'w': shape=4: expected a sequence of ints"),
    ({"w": ((4, 2.5), "F32")}, TypeError, r"tensor 'w': shape=\(4, 2.5\): expected a sequence of ints, got a float"),
    ({"w": ((4, -1), "F32")}, viper.InvalidArgumentError, r"tensor 'w': shape=\(4, -1\): every dimension must be >= 0"),
    ({"w": ((4,), "float32")}, viper.InvalidArgumentError, r"tensor 'w': dtype='float32': must be a torch.dtype or one of F64"),
    ({"w": ((4,), torch.complex64)}, TypeError, r"tensor 'w': torch dtype torch.complex64 has no safetensors equivalent"),
])
def test_begin_cuda_refuses_bad_specs_before_any_gpu_call(pub, tensors, error, match):
    with pytest.raises(error, match=match):
        pub.begin_cuda(tensors)
    assert pub.announced_version == 0


def test_begin_cuda_checks_step_loss_and_device(pub):
    spec = {"w": ((4,), torch.float32)}
    with pytest.raises(ValueError, match=r"Publisher.begin_cuda\(\): device='cpu'"):
        pub.begin_cuda(spec, device="cpu")
    with pytest.raises(ValueError, match=r"Publisher.begin_cuda\(\): step=-1"):
        pub.begin_cuda(spec, step=-1)
    with pytest.raises(TypeError, match=r"Publisher.begin_cuda\(\): loss='x'"):
        pub.begin_cuda(spec, loss="x")


def test_begin_cuda_without_a_cuda_driver_is_a_clear_unavailable_error():
    # In a child process without a driver: bad specs are still refused by the extension's layout
    # check (InvalidArgument, before any GPU call); good ones get Unavailable naming the library.
    code = (
        "import viper\n"
        "p = viper.Publisher('m', listen='127.0.0.1:0')\n"
        "for items in ([('w', 'F32', [4]), ('w', 'F32', [4])], [('w', 'F32', [-2])], []):\n"
        "    try:\n"
        "        p._live().begin_device(items, 0)\n"
        "    except viper.InvalidArgumentError as e:\n"
        "        print('BAD', e)\n"
        "try:\n"
        "    p.begin_cuda({'w': ((4, 4), 'BF16')}, step=3)\n"
        "except viper.ViperIOError as e:\n"
        "    print('REFUSED', e)\n"
        "print('ANNOUNCED', p.announced_version)\n"
        "p.close()\n")
    out = _run_child(code, NO_DRIVER)
    assert 'BAD InvalidArgument: Publisher.begin_cuda(): duplicate tensor name "w"' in out.stdout, out.stdout
    assert "BAD InvalidArgument: Publisher.begin_cuda(): tensor \"w\": shape[0] = -2 is negative" in out.stdout, out.stdout
    assert "BAD InvalidArgument: Publisher.begin_cuda(): no tensors: a version needs at least one" in out.stdout, out.stdout
    assert "REFUSED Unavailable: GPU: /nonexistent/libcuda.so.1 not found" in out.stdout, out.stdout
    assert "ANNOUNCED 0" in out.stdout, out.stdout


def _emulator():
    """The CUDA driver emulator of this build tree (tests/gpu/cuda_emulator.cc): host memory, not a
    GPU; it runs the subscriber's GPU bookkeeping where there is no GPU."""
    build = os.environ.get("VIPER_BINARY_DIR") or os.path.join(os.path.dirname(viper.__file__), "..", "..")
    path = os.path.join(build, "tests", "gpu", "libviper_cuda_emulator.so")
    assert os.path.exists(path), f"{path} missing: it is built with the tests"
    return path


@pytest.mark.parametrize("path", ["auto", "remote"])
def test_version_device_on_the_driver_emulator(path):
    # In a child process with the emulator as its driver: a Subscriber(device=0) of a CPU producer
    # places each version on the (emulated) device: host-to-device once it is loaded (auto: mapped
    # on this host), or piece by piece while it arrives (remote); version.device says which, and
    # load_into a CPU module still copies from host memory.
    code = (
        "import sys, torch, viper\n"
        "p = viper.Publisher('m', listen='127.0.0.1:0', mode='sync')\n"
        "sub = viper.Subscriber('m', connect=p.address, device=0, path=sys.argv[1])\n"
        "src = torch.nn.Linear(64, 32)\n"
        "p.publish(src.state_dict(), step=1)\n"
        "v = sub.wait_for(1, timeout=30)\n"
        "d = v.device\n"
        "assert d['device'] == 0 and d['ptr'] != 0 and not d['in_place'], d\n"
        "assert d['bytes'] == (64 * 32 + 32) * 4, d\n"
        "dst = torch.nn.Linear(64, 32)\n"
        "sub.load_into(dst)\n"
        "assert torch.equal(dst.weight, src.weight) and torch.equal(dst.bias, src.bias)\n"
        "print('HOW', d['how'])\n"
        "sub.close(); p.close()\n")
    out = _run_child(code, _emulator(), path)
    want = "HOW host-to-device as its chunks arrived (" if path == "remote" else "HOW host-to-device ("
    assert out.stdout.startswith(want), out.stdout


def test_close_during_gpu_publishes_on_the_driver_emulator():
    # close() on one thread while another publishes GPU versions (begin_device/commit_device, what
    # Publisher.begin_cuda calls; the emulator's device is host memory): each call holds its own
    # reference to the GpuPublisher, so close() never frees it under a call; the publishing thread
    # gets "closed" errors, and close() returns once the calls in flight are done.
    code = (
        "import threading, time, viper\n"
        "for round in range(5):\n"
        "    p = viper.Publisher('m', listen='127.0.0.1:0')\n"
        "    h = p._live()\n"
        "    published, errors = [], []\n"
        "    def publish():\n"
        "        for i in range(100000):\n"
        "            try:\n"
        "                d = h.begin_device([('w', 'F32', [1 << 18])], 0)\n"
        "                published.append(h.commit_device(d, 0, i, None).version)\n"
        "            except Exception as e:\n"
        "                errors.append(f'{type(e).__name__}: {e}')\n"
        "                return\n"
        "    t = threading.Thread(target=publish)\n"
        "    t.start()\n"
        "    while len(published) < 3:\n"
        "        time.sleep(0.001)\n"
        "    p.close()\n"
        "    t.join()\n"
        "    assert len(errors) == 1 and 'closed' in errors[0], errors\n"
        "    print('ROUND', round, len(published), errors[0])\n"
        # A draft open when the Publisher closes keeps its buffer until it ends: its places stay
        # valid, and its commit fails "closed".
        "p = viper.Publisher('m', listen='127.0.0.1:0')\n"
        "h = p._live()\n"
        "d = h.begin_device([('w', 'F32', [1 << 18])], 0)\n"
        "p.close()\n"
        "assert d.valid and len(d.tensors()) == 1, d.tensors()\n"
        "try:\n"
        "    h.commit_device(d, 0, 1, None)\n"
        "except Exception as e:\n"
        "    print('COMMIT AFTER CLOSE', e)\n"
        "assert not d.valid\n"
        # A draft left to the garbage collector after close holds the last reference to the
        # GpuPublisher: freeing it ends the GPU path (its destructor lets go of the GIL first).
        "p = viper.Publisher('m', listen='127.0.0.1:0')\n"
        "d = p._live().begin_device([('w', 'F32', [1 << 18])], 0)\n"
        "p.close()\n"
        "del d\n"
        "import gc; gc.collect()\n"
        "print('DRAFT FREED AFTER CLOSE')\n")
    out = _run_child(code, _emulator())
    assert "DRAFT FREED AFTER CLOSE" in out.stdout, out.stdout + out.stderr
    assert out.stdout.count("ROUND ") == 5, out.stdout + out.stderr
    assert "COMMIT AFTER CLOSE" in out.stdout and "closed" in out.stdout.split("COMMIT AFTER CLOSE")[1], out.stdout
