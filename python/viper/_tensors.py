"""Conversions between Python tensors (numpy arrays, torch tensors) and Viper's wire form.

Publishing: `to_entries` turns a mapping name -> array/tensor into (name, dtype, shape, buffer)
tuples of C-contiguous host memory that the extension copies once into the segment; non-contiguous
ones are made contiguous (one extra copy, only for them). A mapping whose tensors are all CUDA
tensors on one device goes to `cuda_entries` instead: (name, dtype, shape, device pointer) for the
extension's GPU path, which keeps the version on the device (other GPU tensors are copied to host).

Loading: `copy_into_module` copies a version into a torch module's existing parameters and buffers
in place, so they keep their identity, storage, device and dtype: one streaming copy in C++ for a
contiguous CPU tensor of the version's dtype, `Tensor.copy_` (which converts) otherwise; with a
GPU copy of the version (Subscriber(device=N)), CUDA parameters on that device are copied
device-to-device from it (a torch view of the device memory through __cuda_array_interface__).

torch is imported lazily: numpy-only users never pay for it.
"""
from __future__ import annotations

import sys
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from . import _checks

_NUMPY_TO_SAFETENSORS = {
    np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("float16"): "F16",
    np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16", np.dtype("int8"): "I8",
    np.dtype("uint64"): "U64", np.dtype("uint32"): "U32", np.dtype("uint16"): "U16", np.dtype("uint8"): "U8",
    np.dtype("bool"): "BOOL",
}


def _torch():
    """The torch module if the caller already uses torch (it is imported then), else None."""
    return sys.modules.get("torch")


def _is_torch_tensor(value: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


def _torch_entry(name: str, tensor) -> Tuple[str, str, List[int], Any]:
    torch = _torch()
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    shape = list(t.shape)
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: ship the bits
        return name, "BF16", shape, t.view(torch.int16).numpy()
    array = t.numpy()
    dtype = _NUMPY_TO_SAFETENSORS.get(array.dtype)
    if dtype is None:
        raise TypeError(f"tensor {name!r}: torch dtype {t.dtype} has no safetensors equivalent Viper supports")
    return name, dtype, shape, array


def _numpy_entry(name: str, value: Any) -> Tuple[str, str, List[int], Any]:
    array = np.asarray(value)
    dtype = _NUMPY_TO_SAFETENSORS.get(array.dtype)
    if dtype is None:
        raise TypeError(f"tensor {name!r}: numpy dtype {array.dtype} has no safetensors equivalent Viper supports "
                        f"(supported: {', '.join(sorted(str(d) for d in _NUMPY_TO_SAFETENSORS))})")
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return name, dtype, list(array.shape), array


_TORCH_TO_SAFETENSORS = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                         "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
                         "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def cuda_entries(tensors: Mapping[str, Any]):
    """For a mapping whose values are all torch CUDA tensors on one device (and not empty):
    (device ordinal, the current CUDA stream's handle on it, [(name, dtype, shape, data_ptr)], the
    tensors to keep alive until the publish call returns). None otherwise (the host path)."""
    torch = _torch()
    if torch is None or not isinstance(tensors, Mapping) or not tensors:
        return None
    device = None
    for value in tensors.values():
        if not isinstance(value, torch.Tensor) or not value.is_cuda:
            return None
        if device is not None and value.device.index != device:
            return None
        device = value.device.index
    entries, keep = [], []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {type(name).__name__}")
        _checks.utf8("tensors", "tensor name", name)
        t = value.detach()
        if not t.is_contiguous():
            t = t.contiguous()  # on the current stream: the publish's copy is ordered after it
        dtype = _TORCH_TO_SAFETENSORS.get(str(t.dtype).replace("torch.", ""))
        if dtype is None:
            raise TypeError(f"tensor {name!r}: torch dtype {t.dtype} has no safetensors equivalent Viper supports")
        keep.append(t)
        entries.append((name, dtype, list(t.shape), t.data_ptr()))
    stream = torch.cuda.current_stream(device).cuda_stream
    return device, stream, entries, keep


def to_entries(tensors: Mapping[str, Any]) -> List[Tuple[str, str, List[int], Any]]:
    """(name, safetensors dtype, shape, contiguous host buffer) for every tensor, in the mapping's
    order. Raises TypeError for values that are not arrays/tensors or have unsupported dtypes."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping name -> numpy array or torch tensor, got {type(tensors).__name__}")
    entries = []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {type(name).__name__}")
        _checks.utf8("tensors", "tensor name", name)
        if _is_torch_tensor(value):
            entries.append(_torch_entry(name, value))
        elif isinstance(value, (np.ndarray, np.generic)):
            entries.append(_numpy_entry(name, value))
        else:
            raise TypeError(f"tensor {name!r}: expected a numpy array or torch tensor, got {type(value).__name__}")
    return entries


# Safetensors dtypes whose torch dtype is newer than torch 1.13 (Debian's): (attribute, fallback).
# Without the attribute the tensor comes back as its raw bits in the fallback dtype (F8: uint8), or
# TypeError (U16/U32/U64: reading them as signed ints would change their values).
_NEWER_TORCH_DTYPES = {
    "F8_E4M3": ("float8_e4m3fn", "uint8"), "F8_E5M2": ("float8_e5m2", "uint8"),
    "U16": ("uint16", None), "U32": ("uint32", None), "U64": ("uint64", None),
}


def as_torch(view: np.ndarray, dtype_name: str, name: str = ""):
    """A torch tensor sharing the read-only view's memory (no copy), with the snapshot's dtype
    (BF16 as torch.bfloat16; F8 as torch.float8_* where torch has them, else uint8 bits; U16/U32/U64
    as torch.uint* where torch has them, else TypeError naming the tensor).
    The tensor must not be written: the memory may be the node's shared segment."""
    torch = _torch()
    if torch is None:
        import torch  # noqa: PLC0415 (lazy)
    target = None
    if dtype_name == "BF16":
        view = view.view(np.int16)  # torch 1.13 has no uint16: reinterpret the bits as int16 first
        target = torch.bfloat16
    elif dtype_name in _NEWER_TORCH_DTYPES:
        attr, fallback = _NEWER_TORCH_DTYPES[dtype_name]
        target = getattr(torch, attr, None)
        if target is None and fallback is None:
            raise TypeError(f"tensor {name!r}: torch {torch.__version__} has no {attr} tensors: read it as a numpy "
                            f"view (version[{name!r}]) instead")
        if target is not None and dtype_name.startswith("U"):
            view = view.view(np.dtype(f"int{view.dtype.itemsize * 8}"))  # same bits; torch.from_numpy takes signed
    with warnings.catch_warnings():
        # torch warns that the array is not writable; the caller only reads it (copy_ source).
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(view)
    return t.view(target) if target is not None else t


def to_state_dict(version, copy: bool = False):
    """An OrderedDict name -> torch tensor of every tensor of `version` (a ModelVersion or a
    Snapshot), in data order; see viper.to_state_dict."""
    from collections import OrderedDict  # noqa: PLC0415

    dtypes = version.dtypes
    out = OrderedDict()
    for name, view in version.items():
        t = as_torch(view, dtypes[name][0], name)
        out[name] = t.clone() if copy else t
    return out


def cuda_ordinal(owner: str, name: str, value: Any) -> int:
    """A CUDA device ordinal from an int >= 0, "cuda:N" or a torch.device of type cuda."""
    torch = _torch()
    if torch is not None and isinstance(value, torch.device):
        if value.type != "cuda":
            raise ValueError(f"{owner}: {name}={value!r}: must be a CUDA device, not {value.type}")
        return value.index or 0
    if isinstance(value, str) and value.startswith("cuda:") and value[5:].isdigit():
        return int(value[5:])
    if isinstance(value, str) and value == "cuda":
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner}: {name}={value!r}: must be a CUDA device ordinal >= 0, 'cuda:N' or a torch.device")
    return value


class _CudaBytes:
    """`nbytes` bytes of device memory at `ptr`, offered to torch through __cuda_array_interface__
    (no copy); the owner (a ModelVersion, a CudaDraft) must outlive every tensor made from it.
    "stream": None: torch does not synchronize on making the tensor (the owner orders the work).
    The read-only flag is always False: torch 2.x refuses read-only CUDA memory ("the read only flag
    is not supported"); a version's GPU copy is read-only by contract, not by the tensor."""

    def __init__(self, ptr: int, nbytes: int, owner: Any):
        self._owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


_TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                 "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def device_source(version, name: str, dtype_name: str, shape, device_info: dict, offsets: dict):
    """A torch tensor viewing tensor `name` of the version's GPU copy (no copy)."""
    import torch  # noqa: PLC0415 (lazy)
    begin, nbytes = offsets[name]
    raw = torch.as_tensor(_CudaBytes(device_info["ptr"] + begin, nbytes, version), device=f"cuda:{device_info['device']}")
    if dtype_name not in _TORCH_DTYPES:
        raise TypeError(f"torch has no {dtype_name.lower()} tensors: tensor {name!r} cannot be loaded on the GPU")
    return raw.view(getattr(torch, _TORCH_DTYPES[dtype_name])).reshape(tuple(shape))


def copy_into_module(version, module, strict: bool = True) -> None:
    """Copies every tensor of `version` into `module`'s state (parameters and buffers) in place.

    strict: every state entry must be in the version and vice versa (ValueError naming the
    differences otherwise). Shapes must match exactly (ValueError). Nothing is copied unless every
    check passes, so a bad version leaves the module as it was."""
    import torch  # noqa: PLC0415 (lazy: only load_into needs torch)

    state = _module_state(torch, module)
    device_only = len(version) == 0 and version.device is not None  # gpu_early: no host bytes
    dtypes = version._device_tensors() if device_only else version.dtypes
    names = set(dtypes)
    if strict:
        missing = sorted(set(state) - names)
        unexpected = sorted(names - set(state))
        if missing or unexpected:
            raise ValueError(f"load_into: the version does not match the module: missing {missing[:8]}"
                             f"{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
                             f"{'...' if len(unexpected) > 8 else ''}")
    pairs = []
    for name, target in state.items():
        if name not in names:
            continue
        dtype_name, shape = dtypes[name]
        if tuple(target.shape) != tuple(shape):
            raise ValueError(f"load_into: tensor {name!r} has shape {tuple(shape)} in the version, "
                             f"{tuple(target.shape)} in the module")
        if device_only and dtype_name not in _TORCH_DTYPES:
            raise TypeError(f"load_into: tensor {name!r} ({dtype_name}) of version {version.version} is on the GPU only "
                            f"(gpu_early) and torch has no such tensors to view it as")
        if device_only and not (target.is_cuda and target.device.index == version.device["device"]):
            raise ValueError(f"load_into: version {version.version} is on GPU {version.device['device']} only "
                             f"(gpu_early: no host bytes) and tensor {name!r} of the module is on {target.device}")
        _check_bits_target(torch, name, dtype_name, target)
        pairs.append((name, target, dtype_name, shape))
    _refuse_viewed_targets(pairs)
    device_info = version.device  # with Subscriber(device=N): the version's GPU copy
    offsets = version._offsets() if device_info is not None else None
    on_device = False
    # Every source first (views, no copy; as_torch may still refuse a dtype), then the copies: a
    # failure leaves the module as it was.
    plain, plain_targets, converted = [], [], []  # plain: (name, address, nbytes), one streaming copy each
    for name, target, dtype_name, shape in pairs:
        if (device_info is not None and target.is_cuda and target.device.index == device_info["device"]
                and dtype_name in _TORCH_DTYPES):
            converted.append((target, device_source(version, name, dtype_name, shape, device_info, offsets)))
            on_device = True
        elif _plain_copy(torch, target, dtype_name):
            plain.append((name, target.data_ptr(), target.numel() * target.element_size()))
            plain_targets.append(target)
        else:
            converted.append((target, as_torch(version[name], dtype_name, name)))
    with torch.no_grad():
        for target, source in converted:
            target.copy_(source)  # keeps the parameter's storage, device and dtype
        if plain:
            version._copy_into(plain)  # in C++ without the GIL
            for target in plain_targets:  # as copy_ does: bumps the version counter autograd checks
                target.detach().view(-1)[:0].zero_()
        if on_device:
            torch.cuda.current_stream(device_info["device"]).synchronize()  # the version may go once we return


def _module_state(torch, module) -> Dict[str, Any]:
    """name -> tensor of a torch module (parameters and buffers) or of a mapping, whose every value
    must be a torch tensor (TypeError naming the first that is not)."""
    if hasattr(module, "state_dict"):
        state = module.state_dict(keep_vars=True)
    else:
        state = dict(module)
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"load_into: {name!r} is a {type(value).__name__}: load_into copies into a torch module or "
                            f"a mapping name -> torch tensor (read numpy arrays from the version: version[{name!r}])")
    return state


def _check_bits_target(torch, name: str, dtype_name: str, target) -> None:
    """A dtype this torch lacks (F8 before torch 2.1) comes as its raw bits (uint8): loading those
    into another dtype would convert the integers, so only a uint8 target takes them."""
    if dtype_name not in _NEWER_TORCH_DTYPES or _torch_dtype(torch, dtype_name) is not None:
        return
    attr, fallback = _NEWER_TORCH_DTYPES[dtype_name]
    if fallback is None:
        raise TypeError(f"load_into: tensor {name!r}: torch {torch.__version__} has no {attr} tensors to load the "
                        f"version's {dtype_name} into (read it as a numpy view: version[{name!r}])")
    if target.dtype != getattr(torch, fallback):
        raise TypeError(f"load_into: tensor {name!r} is {dtype_name} in the version and {target.dtype} in the module: "
                        f"torch {torch.__version__} has no torch.{attr}, so only its raw bits load (into a "
                        f"torch.{fallback} tensor); copy_ would convert the bits as integers")


def _refuse_viewed_targets(pairs) -> None:
    """ValueError naming the first CPU target whose memory lies in the buffer of a live Viper
    version or snapshot (a state_dict() view of one: read-only, and mapped read-only for map and
    file versions, where the write would kill the process)."""
    from . import _viper  # noqa: PLC0415

    strided = _torch().strided
    cpu = [(name, target) for name, target, _, _ in pairs
           if target.device.type == "cpu" and target.layout == strided and target.numel() > 0]
    ranges = [_extent(target) for _, target in cpu]
    first = _viper._first_in_viewed_buffer(ranges) if ranges else -1
    if first >= 0:
        raise ValueError(f"load_into: tensor {cpu[first][0]!r} of the module lies in the memory of a Viper version or "
                         f"snapshot (a view from state_dict() or to_state_dict()), which is read-only: load into "
                         f"tensors of your own (to_state_dict(version, copy=True) makes them)")


def _extent(target) -> Tuple[int, int]:
    """(address, nbytes) of the memory a non-empty strided tensor's elements span."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(target.shape, target.stride()))
    return target.data_ptr(), span * target.element_size()


def _plain_copy(torch, target, dtype_name: str) -> bool:
    """Whether `target` takes tensor bytes as they are: a dense CPU tensor, contiguous, of exactly
    the version's dtype (targets inside a version's buffer are refused before). Then load_into
    copies with one streaming copy in C++ (GIL released) instead of Tensor.copy_, which ran at
    0.55-0.6x memcpy on one thread (docs/ARCHITECTURE.md, "load_into copies with one streaming
    copy"); anything else (another dtype, a GPU or strided target) goes through copy_, which
    converts."""
    if target.device.type != "cpu" or target.layout != torch.strided or not target.is_contiguous():
        return False
    if target.is_quantized or target.is_conj() or target.is_neg():
        return False
    return target.dtype == _torch_dtype(torch, dtype_name)


def _torch_dtype(torch, dtype_name: str):
    """The torch dtype whose bytes are the safetensors dtype's, or None."""
    name = _TORCH_DTYPES.get(dtype_name)
    if name is None and dtype_name in _NEWER_TORCH_DTYPES:
        name = _NEWER_TORCH_DTYPES[dtype_name][0]
    return getattr(torch, name, None) if name else None



def cuda_specs(owner: str, tensors: Mapping[str, Any]) -> List[Tuple[str, str, List[int]]]:
    """[(name, safetensors dtype, shape)] from {name: (shape, dtype)} (dtype a torch.dtype or a
    safetensors name such as "F32"; shape a sequence of ints >= 0) or {name: tensor} (its shape and
    dtype), in the mapping's order. TypeError / viper.InvalidArgumentError naming the tensor."""
    torch = _torch()
    if not isinstance(tensors, Mapping):
        raise TypeError(f"{owner}: tensors={_checks.shown(tensors)}: expected a mapping name -> (shape, dtype), "
                        f"got {type(tensors).__name__}")
    if not tensors:
        raise _checks.InvalidArgumentError(f"{owner}: tensors={{}}: must name at least one tensor")
    items = []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"{owner}: tensor names must be str, got {type(name).__name__} ({_checks.shown(name)})")
        _checks.utf8(owner, "tensor name", name)
        if torch is not None and isinstance(value, torch.Tensor):
            shape, dtype = tuple(value.shape), value.dtype
        elif isinstance(value, (tuple, list)) and len(value) == 2:
            shape, dtype = value
        else:
            raise TypeError(f"{owner}: tensor {name!r}: {_checks.shown(value)}: expected (shape, dtype) or a torch "
                            f"tensor, got {type(value).__name__}")
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
            raise TypeError(f"{owner}: tensor {name!r}: shape={_checks.shown(shape)}: expected a sequence of ints, "
                            f"got {type(shape).__name__}")
        dims = []
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, int):
                raise TypeError(f"{owner}: tensor {name!r}: shape={_checks.shown(shape)}: expected a sequence of "
                                f"ints, got a {type(d).__name__} in it")
            if d < 0:
                raise _checks.InvalidArgumentError(f"{owner}: tensor {name!r}: shape={_checks.shown(shape)}: every "
                                                   f"dimension must be >= 0")
            dims.append(int(d))
        if torch is not None and isinstance(dtype, torch.dtype):
            st = _TORCH_TO_SAFETENSORS.get(str(dtype).replace("torch.", ""))
            if st is None:
                raise TypeError(f"{owner}: tensor {name!r}: torch dtype {dtype} has no safetensors equivalent "
                                f"Viper supports")
        elif isinstance(dtype, str) and dtype in _SAFETENSORS_NAMES:
            st = dtype
        else:
            raise _checks.InvalidArgumentError(
                f"{owner}: tensor {name!r}: dtype={_checks.shown(dtype)}: must be a torch.dtype or one of "
                f"{', '.join(_SAFETENSORS_NAMES)}")
        items.append((name, st, dims))
    return items


_SAFETENSORS_NAMES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL",
                      "F8_E4M3", "F8_E5M2")


class CudaDraft:
    """A version being written in place on the GPU (Publisher.begin_cuda): `draft[name]` is a torch
    CUDA tensor viewing that tensor's place in the version's device buffer (the snapshot's layout),
    to be written by work on torch's current stream (copy_, kernels, an optimizer's foreach ops).

    commit() (or leaving the `with` block without an exception) publishes it: ordered after torch's
    current stream by an event, the call returns without waiting for the device, and the version
    goes the way of a GPU publish() (announced when the writes are done; host copy in the
    background). An exception in the block, or abort(), abandons it: torch's current stream is
    synchronized (no write may still be running into the buffer) and nothing is announced.
    The tensors must not be used after commit or abort: the buffer then belongs to the version
    (or to a later one)."""

    def __init__(self, publisher: Any, draft: Any, step: int, loss: Optional[float]):
        self._publisher = publisher
        self._draft = draft
        self.step = step
        self.loss = loss
        self.result = None  # the PublishResult once committed
        self._device = draft.device
        self._places = {name: (dtype, tuple(shape), ptr, nbytes) for name, dtype, shape, ptr, nbytes in draft.tensors()}
        self._views: Dict[str, Any] = {}

    def __getitem__(self, name: str):
        if not self._draft.valid:
            raise KeyError(f"CudaDraft: {name!r}: the draft is already committed or aborted")
        view = self._views.get(name)
        if view is None:
            if name not in self._places:
                raise KeyError(f"CudaDraft: no tensor {name!r} (tensors: {', '.join(list(self._places)[:8])})")
            import torch  # noqa: PLC0415
            dtype_name, shape, ptr, nbytes = self._places[name]
            target = _torch_dtype(torch, dtype_name)
            if target is None:
                raise TypeError(f"CudaDraft: tensor {name!r}: torch {torch.__version__} has no {dtype_name} tensors")
            raw = torch.as_tensor(_CudaBytes(ptr, nbytes, self), device=f"cuda:{self._device}")
            view = raw.view(target).reshape(shape)
            self._views[name] = view
        return view

    def keys(self):
        return self._places.keys()

    def __iter__(self):
        return iter(self._places)

    def __len__(self) -> int:
        return len(self._places)

    def __contains__(self, name: object) -> bool:
        return name in self._places

    @property
    def device(self) -> int:
        """The CUDA device ordinal of the version's buffer."""
        return self._device

    def commit(self, step: Optional[int] = None, loss: Optional[float] = None):
        """Publishes the version (step/loss override those given to begin_cuda) and returns its
        PublishResult. Raises if already committed or aborted."""
        owner = "CudaDraft.commit()"
        step = self.step if step is None else _checks.integer(owner, "step", step)
        loss = self.loss if loss is None else _checks.optional_number(owner, "loss", loss)
        import torch  # noqa: PLC0415
        stream = torch.cuda.current_stream(self._device).cuda_stream
        self._views.clear()
        self.result = self._publisher._live().commit_device(self._draft, stream, step, loss)
        return self.result

    def abort(self) -> None:
        """Abandons the version (nothing is announced); synchronizes torch's current stream first so
        that no queued write still runs into the buffer. Does nothing once committed or aborted."""
        if not self._draft.valid:
            return
        torch = _torch()
        self._views.clear()
        try:
            if torch is not None and torch.cuda.is_available():
                torch.cuda.current_stream(self._device).synchronize()
        finally:
            self._draft.abort()

    def __enter__(self) -> "CudaDraft":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self._draft.valid:
            self.commit()
        else:
            self.abort()
