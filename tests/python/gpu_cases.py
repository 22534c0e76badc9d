"""Publisher.begin_cuda (zero-copy GPU publish) on a CUDA GPU: tensors written in place in the
version's device buffer, committed, read bit for bit by a host consumer and by a GPU consumer in
another process; an aborted draft publishes nothing. The checks that need no GPU (spec errors, the
no-driver error) are in test_gpu.py.

Not a test_*.py file: CTest runs it as `python_gpu_cases` through this file's main, which without
a usable GPU prints "SKIPPED: <reason>" and exits 77 (CTest: Skipped, never Passed), or exits 1
with VIPER_FAIL_ON_SKIP=1 (scripts/gpu-check.sh on a GPU machine). Run by hand:
    PYTHONPATH=build/python /usr/bin/python3 tests/python/gpu_cases.py
"""
import os
import subprocess
import sys

import pytest
import torch

import viper


@pytest.fixture
def pub():
    p = viper.Publisher("m", listen="127.0.0.1:0", mode="sync")
    yield p
    p.close()


def _needs_cuda():
    """Skips (visibly) without a usable CUDA GPU; with VIPER_FAIL_ON_SKIP=1 (scripts/gpu-check.sh on
    a GPU machine) that is a failure instead."""
    if torch.cuda.is_available():
        return
    reason = "needs a CUDA GPU: torch.cuda.is_available() is False"
    if os.environ.get("VIPER_FAIL_ON_SKIP") == "1":
        pytest.fail(reason + " (VIPER_FAIL_ON_SKIP=1)")
    pytest.skip(reason)


def test_begin_cuda_writes_in_place_and_commits_bit_exact(pub):
    _needs_cuda()
    producer = torch.nn.Linear(64, 32).cuda()
    spec = {name: t for name, t in producer.state_dict().items()}
    with viper.Subscriber("m", connect=pub.address) as sub:  # a host consumer: the sealed host bytes
        for step in range(3):
            with torch.no_grad():
                producer.weight.add_(1.0)
            with pub.begin_cuda(spec, step=step, loss=0.5) as draft:
                assert set(draft) == {"weight", "bias"} and len(draft) == 2
                for name, t in producer.state_dict().items():
                    view = draft[name]
                    assert view.is_cuda and view.device.index == draft.device
                    assert view.shape == t.shape and view.dtype == t.dtype
                    view.copy_(t)  # on torch's current stream: the commit is ordered after it
            result = draft.result
            assert result.version == step + 1
            version = sub.wait_for(result.version, timeout=30)
            assert version.step == step
            consumer = torch.nn.Linear(64, 32)
            sub.load_into(consumer)
            assert torch.equal(consumer.weight, producer.weight.cpu())
            assert torch.equal(consumer.bias, producer.bias.cpu())
            with pytest.raises(KeyError, match="already committed or aborted"):
                draft["weight"]
    pub.wait()


def test_begin_cuda_aborts_on_an_exception_and_publishes_nothing(pub):
    _needs_cuda()
    with pytest.raises(RuntimeError, match="training failed"):
        with pub.begin_cuda({"w": ((1 << 20,), torch.float32)}) as draft:
            draft["w"].fill_(1.0)
            raise RuntimeError("training failed")
    assert draft.result is None
    pub.wait()
    assert pub.announced_version == 0
    # The next draft is version 1 (no number taken by the aborted one).
    with pub.begin_cuda({"w": ((1 << 20,), torch.float32)}) as draft:
        draft["w"].fill_(2.0)
    assert draft.result.version == 1
    pub.wait()
    assert pub.announced_version == 1


def _gpu_child(address, *subscriber_args):
    """A consumer process: Subscriber('m', device=0, <subscriber_args: more keyword arguments, as
    Python source>) loads version 1 into a CUDA Linear(256, 128) with load_into and prints a digest
    of its bytes and how the version reached its GPU. Returns it once subscribed."""
    code = (
        "import hashlib, sys, torch, viper\n"
        "sub = viper.Subscriber('m', connect=sys.argv[1], device=0" + "".join(", " + a for a in subscriber_args) + ")\n"
        "print('READY', flush=True)\n"
        "v = sub.wait_for(1, timeout=60)\n"
        "m = torch.nn.Linear(256, 128).cuda()\n"
        "sub.load_into(m)\n"
        "h = hashlib.sha256(m.weight.detach().cpu().numpy().tobytes() + m.bias.detach().cpu().numpy().tobytes())\n"
        "print('DIGEST', h.hexdigest(), v.device['how'], flush=True)\n"
        "sub.close()\n")
    child = subprocess.Popen([sys.executable, "-c", code, address], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "READY"
    return child


def _digest(module):
    import hashlib
    return hashlib.sha256(module.weight.detach().cpu().numpy().tobytes()
                          + module.bias.detach().cpu().numpy().tobytes()).hexdigest()


def _expect_child_loaded(child, producer, how=""):
    """The child's DIGEST line names producer's bytes (and `how` the version reached its GPU)."""
    line = child.stdout.readline().strip()
    assert line.startswith(f"DIGEST {_digest(producer)} "), line
    assert how in line, line
    print(line)


def test_begin_cuda_reaches_a_gpu_subscriber_in_another_process(pub):
    _needs_cuda()
    # The child subscribes with device=0, loads version 1 into a CUDA module from the GPU copy and
    # prints a digest of its bytes.
    child = _gpu_child(pub.address)
    try:
        producer = torch.nn.Linear(256, 128).cuda()
        with pub.begin_cuda(producer.state_dict()) as draft:
            for name, t in producer.state_dict().items():
                draft[name].copy_(t)
        _expect_child_loaded(child, producer)
    finally:
        child.wait(timeout=60)


def test_publish_of_cuda_tensors_reaches_gpu_and_host_consumers_bit_exact(pub):
    _needs_cuda()
    # Publisher.publish of a state_dict of CUDA tensors takes the GPU path (a GpuPublisher on torch's
    # current stream); a GPU consumer in another process copies the version device to device through
    # the node (CUDA IPC), a host consumer here gets the sealed host copy.
    child = _gpu_child(pub.address)
    try:
        producer = torch.nn.Linear(256, 128).cuda()
        with viper.Subscriber("m", connect=pub.address) as host:
            result = pub.publish(producer.state_dict(), step=7)
            assert result.version == 1
            pub.wait()
            version = host.wait_for(1, timeout=60)
            assert version.step == 7
            consumer = torch.nn.Linear(256, 128)
            host.load_into(consumer)
            assert torch.equal(consumer.weight, producer.weight.cpu()) and torch.equal(consumer.bias, producer.bias.cpu())
        _expect_child_loaded(child, producer, "device-to-device")
    finally:
        child.wait(timeout=60)


def test_a_gpu_consumer_on_the_network_path_stages_the_chunks_on_its_gpu(pub):
    _needs_cuda()
    # A CPU producer's version over the network engine (path="remote", as from another host): the
    # consumer copies each landed piece to its GPU while the transfer runs, then load_into copies
    # device to device into its CUDA module.
    child = _gpu_child(pub.address, "path='remote'")
    try:
        producer = torch.nn.Linear(256, 128)
        pub.publish(producer.state_dict())
        pub.wait()
        _expect_child_loaded(child, producer, "host-to-device as its chunks arrived")
    finally:
        child.wait(timeout=60)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        strict = os.environ.get("VIPER_FAIL_ON_SKIP") == "1"
        print("SKIPPED: gpu_cases.py needs a CUDA GPU: torch.cuda.is_available() is False"
              + (" (VIPER_FAIL_ON_SKIP=1: counted as a failure)" if strict else ""))
        sys.exit(1 if strict else 77)
    sys.exit(pytest.main([__file__, "-q", "-rs", "-p", "no:cacheprovider"]))
