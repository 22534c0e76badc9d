"""Subscriber.load_into's copy and the subscriber's kept mappings (the consumer's side of an update).

A CPU tensor of the version's own dtype is filled by one streaming copy in C++ (GIL released);
other targets (another dtype, not contiguous) go through torch's copy_, which converts. The map
path keeps its mapping of each node segment between versions, so a recycled segment is read
without page faults.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_load_into.py
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import viper


def test_plain_and_converting_targets_get_the_same_values_in_place(pair):
    pub, sub = pair
    torch.manual_seed(3)
    state = {"f32": torch.randn(64, 33), "bf16": torch.randn(17).to(torch.bfloat16),
             "i64": torch.randint(-9, 9, (5, 5)), "u8": torch.randint(0, 255, (300,), dtype=torch.uint8),
             "flag": torch.rand(9) > 0.5, "empty": torch.zeros(0, 4), "scalar": torch.tensor(2.5)}
    pub.publish(state, step=1)
    sub.wait_for(1, timeout=30)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    target["as_f64"] = torch.zeros(64, 33, dtype=torch.float64)  # another dtype: copy_ converts
    strided = torch.zeros(33, 64).t()  # the right shape, not contiguous: copy_ handles the strides
    target["strided"] = strided
    pub.publish(dict(state, as_f64=state["f32"], strided=state["f32"]), step=2)
    sub.wait_for(2, timeout=30)
    pointers = {k: t.data_ptr() for k, t in target.items()}
    counters = {k: t._version for k, t in target.items()}
    sub.load_into(target)
    for name, want in state.items():
        assert target[name].dtype == want.dtype and torch.equal(target[name], want), name
    assert torch.equal(target["as_f64"], state["f32"].double())
    assert torch.equal(strided, state["f32"]) and target["strided"] is strided
    assert {k: t.data_ptr() for k, t in target.items()} == pointers  # filled in place
    for name, t in target.items():  # as Tensor.copy_: autograd sees each tensor changed
        assert t._version > counters[name], name


def test_a_module_loads_every_version_right_while_segments_are_recycled(pair):
    pub, sub = pair
    module = torch.nn.Linear(256, 128)
    for v in range(1, 9):  # retention keeps 2 versions: the node writes into its segments again
        pub.publish({"weight": torch.full((128, 256), float(v)), "bias": torch.full((128,), -float(v))}, step=v)
        got = sub.wait_for(v, timeout=30)
        assert got.path == "map", got.reason
        sub.load_into(module)
        assert (module.weight == v).all() and (module.bias == -v).all(), v
    stats = sub.stats()
    assert stats["segments_mapped"] + stats["segments_reused"] == 8
    assert stats["segments_mapped"] <= 4 and stats["segments_reused"] >= 4, stats


def test_a_parameter_with_grad_loads_and_backward_still_works(pair):
    pub, sub = pair
    module = torch.nn.Linear(4, 2)
    pub.publish({"weight": torch.ones(2, 4), "bias": torch.zeros(2)}, step=1)
    sub.wait_for(1, timeout=30)
    sub.load_into(module)
    assert module.weight.requires_grad and torch.equal(module.weight.detach(), torch.ones(2, 4))
    module(torch.ones(3, 4)).sum().backward()
    assert torch.equal(module.weight.grad, torch.full((2, 4), 3.0))


def test_a_target_in_an_older_versions_mapping_is_refused_and_the_process_lives():
    """state_dict() of an earlier "map" version views a read-only mapping of the node's segment:
    load_into used to write into it (SIGSEGV). A subprocess, so that a crash fails this test only."""
    script = textwrap.dedent("""
        import torch, viper
        with viper.Publisher("m", mode="sync") as pub, viper.Subscriber("m", connect=pub.address) as sub:
            pub.publish({"w": torch.ones(4, 4)}, step=1)
            v1 = sub.wait_for(1, timeout=30)
            assert v1.path == "map", v1.reason
            old = v1.state_dict()
            pub.publish({"w": torch.full((4, 4), 2.0)}, step=2)
            sub.wait_for(2, timeout=30)
            for target in (old, {"w": old["w"].t()}):  # the streaming copy, and copy_ (not contiguous)
                try:
                    sub.load_into(target)
                    print("loaded")
                except ValueError as e:
                    assert "'w'" in str(e) and "read-only" in str(e), e
                    print("refused")
            assert bool((old["w"] == 1.0).all())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["refused", "refused"], (proc.returncode, proc.stdout,
                                                                                  proc.stderr)


def test_a_target_in_another_versions_private_buffer_is_refused():
    """A "copy" version sits in a private buffer: writing there changed it for every holder."""
    with viper.Publisher("m", listen="127.0.0.1:0", mode="sync") as pub, \
            viper.Subscriber("m", connect=pub.address, path="copy") as sub:
        pub.publish({"w": torch.ones(8)}, step=1)
        v1 = sub.wait_for(1, timeout=30)
        assert v1.path == "copy", v1.reason
        old = v1.state_dict()
        pub.publish({"w": torch.full((8,), 2.0)}, step=2)
        sub.wait_for(2, timeout=30)
        with pytest.raises(ValueError, match="tensor 'w' of the module lies in the memory of a Viper version"):
            sub.load_into(old)
        assert bool((v1.state_dict()["w"] == 1.0).all())
        own = v1.state_dict(copy=True)  # tensors of its own load
        sub.load_into(own)
        assert bool((own["w"] == 2.0).all())


def _publish_raw(pub, entries, step):
    """Publishes (name, safetensors dtype, shape, numpy bits) entries as they are (F8 has no numpy
    or torch 1.13 dtype for Publisher.publish to take)."""
    pub._live().publish(entries, step, None, {})


def test_f8_loads_only_into_uint8_where_torch_has_no_float8(pair):
    """torch 1.13 has no float8: the version's F8 tensor is its raw bits (uint8), and copy_ into a
    float target converted those integers (1.0, 2.0, -1.0, 0.0 came out 56, 64, 184, 0)."""
    pub, sub = pair
    bits = np.array([0x38, 0x40, 0xB8, 0x00], dtype=np.uint8)  # F8_E4M3 1.0, 2.0, -1.0, 0.0
    _publish_raw(pub, [("e4", "F8_E4M3", [4], bits)], 1)
    sub.wait_for(1, timeout=30)
    if hasattr(torch, "float8_e4m3fn"):  # torch >= 2.1: a real float8 tensor, copy_ converts the values
        target = {"e4": torch.zeros(4)}
        sub.load_into(target)
        assert target["e4"].tolist() == [1.0, 2.0, -1.0, 0.0]
        return
    target = {"e4": torch.zeros(4)}
    with pytest.raises(TypeError, match=r"'e4' is F8_E4M3 in the version and torch.float32 in the module"):
        sub.load_into(target)
    assert target["e4"].tolist() == [0.0] * 4
    bits_target = {"e4": torch.zeros(4, dtype=torch.uint8)}
    sub.load_into(bits_target)
    assert bits_target["e4"].numpy().tobytes() == bits.tobytes()


def test_a_failed_load_leaves_the_module_as_it_was(pair):
    """The checks of every tensor come before the first copy: a good tensor (copy_ converts it)
    followed by one that cannot load (U32 where torch has no uint32; a target inside another
    version's memory) is not copied."""
    pub, sub = pair
    if not hasattr(torch, "uint32"):  # torch >= 2.3 loads U32
        pub.publish({"good": torch.full((16,), 7.0), "bad": np.arange(3, dtype=np.uint32)}, step=1)
        sub.wait_for(1, timeout=30)
        module = {"good": torch.zeros(16, dtype=torch.float64), "bad": torch.zeros(3, dtype=torch.int64)}
        with pytest.raises(TypeError, match="'bad'"):
            sub.load_into(module)
        assert module["good"].tolist() == [0.0] * 16, "the good tensor was copied before the bad one failed"
    with viper.Subscriber("m", connect=pub.address, path="copy") as copying:  # private buffers: no SIGSEGV
        pub.publish({"good": torch.full((16,), 8.0), "bad": torch.ones(4, 4)}, step=2)
        v2 = copying.wait_for(2, timeout=30)
        pub.publish({"good": torch.full((16,), 9.0), "bad": torch.ones(4, 4)}, step=3)
        copying.wait_for(3, timeout=30)
        module = {"good": torch.zeros(16, dtype=torch.float64), "bad": v2.state_dict()["bad"]}
        with pytest.raises(ValueError, match="'bad' of the module lies in the memory"):
            copying.load_into(module)
        assert module["good"].tolist() == [0.0] * 16


@pytest.mark.parametrize("value", [np.zeros(2, np.float32), 3], ids=["numpy", "int"])
def test_load_into_a_mapping_of_other_things_than_tensors_says_what_it_takes(pair, value):
    pub, sub = pair
    pub.publish({"w": np.ones(2, np.float32)}, step=1)
    sub.wait_for(1, timeout=30)
    with pytest.raises(TypeError, match=r"load_into: 'w' is a (ndarray|int): load_into copies into a torch module or "
                                        r"a mapping name -> torch tensor"):
        sub.load_into({"w": value})


@pytest.mark.parametrize("prepared", [False, True])
def test_prepare_makes_the_first_segment_ahead(prepared):
    """Without prepare() the first publish creates its segment on the caller's thread (not
    recycled); with it, the segment made in the background is there (or waited for)."""
    state = {"w": torch.ones(1 << 20), "b": torch.zeros(10)}
    with viper.Publisher("m", listen="127.0.0.1:0") as pub:
        if prepared:
            pub.prepare(state, run="a")
        first = pub.publish(state, step=1, run="a")
        pub.wait(30)
    assert first.recycled is prepared


def test_prepare_checks_its_arguments():
    with viper.Publisher("m", listen="127.0.0.1:0") as pub:
        with pytest.raises(TypeError, match=r"Publisher.prepare\(\): tensors=.*expected a mapping"):
            pub.prepare([1, 2])
        with pytest.raises(TypeError, match="expected a numpy array or torch tensor"):
            pub.prepare({"w": "not a tensor"})
        assert pub.announced_version == 0  # nothing is published


def test_a_plain_cpu_target_is_filled_by_the_streaming_copy_from_a_kept_mapping(pair, monkeypatch):
    """What makes load_into cost about one memcpy (64 MiB: 0.66x a memcpy's CPU; 1.31x with torch's
    copy_ from a fresh mapping): a target of the version's own dtype never goes through
    Tensor.copy_, and a version in a segment mapped before reuses the mapping. The figure itself is
    measured by the demo beside a warm memcpy (docs/BENCHMARKS.md), not asserted here: CPU time on
    a shared 2-core VM moved by more than the 10% such a check could allow."""
    pub, sub = pair
    copied = []
    torch_copy = torch.Tensor.copy_

    def counting_copy(self, *args, **kwargs):
        copied.append(tuple(self.shape))
        return torch_copy(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", counting_copy)
    n = 1 << 20
    module = {"w": torch.zeros(n), "as_f64": torch.zeros(7, dtype=torch.float64)}
    pointer = module["w"].data_ptr()
    for v in range(1, 9):
        pub.publish({"w": torch.full((n,), float(v)), "as_f64": torch.full((7,), float(v))}, step=v)
        sub.wait_for(v, timeout=30)
        before = sub.stats()
        copied.clear()
        sub.load_into(module)
        assert copied == [(7,)], f"version {v}: Tensor.copy_ filled {copied}, only the converted target should be"
        assert module["w"].data_ptr() == pointer and float(module["w"][0]) == v and float(module["w"][-1]) == v
        assert torch.equal(module["as_f64"], torch.full((7,), float(v), dtype=torch.float64))
        assert sub.stats()["segments_reused"] + sub.stats()["segments_mapped"] == \
            before["segments_reused"] + before["segments_mapped"], "load_into mapped again"
    stats = sub.stats()
    assert stats["segments_mapped"] <= 4 and stats["segments_reused"] >= 4, stats
