// Tensors between Python and Viper: snapshots as read-only numpy views (no copy), and the
// (name, dtype, shape, buffer) tuples of python/viper/_tensors.py as TensorData.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api_bindings.h"
#include "core/memory.h"

namespace viper_py {

using viper::Status;
using viper::StatusCode;

// numpy has no bfloat16 or float8: those come back as their raw bit patterns (uint16 / uint8);
// python/viper/_tensors.py reinterprets them for torch.
py::dtype NumpyDtype(viper::DType dtype) {
  switch (dtype) {
    case viper::DType::kF64: return py::dtype("float64");
    case viper::DType::kF32: return py::dtype("float32");
    case viper::DType::kF16: return py::dtype("float16");
    case viper::DType::kBF16: return py::dtype("uint16");
    case viper::DType::kI64: return py::dtype("int64");
    case viper::DType::kI32: return py::dtype("int32");
    case viper::DType::kI16: return py::dtype("int16");
    case viper::DType::kI8: return py::dtype("int8");
    case viper::DType::kU64: return py::dtype("uint64");
    case viper::DType::kU32: return py::dtype("uint32");
    case viper::DType::kU16: return py::dtype("uint16");
    case viper::DType::kU8: return py::dtype("uint8");
    case viper::DType::kBool: return py::dtype("bool");
    case viper::DType::kF8_E4M3: return py::dtype("uint8");
    case viper::DType::kF8_E5M2: return py::dtype("uint8");
  }
  return py::dtype("uint8");
}

// A read-only numpy array over the tensor's bytes inside `snap`; `base` keeps them alive. The
// strides cannot overflow: the parser refuses a shape whose nonzero dims times the dtype size
// pass 2^63-1 bytes, even where a zero dim leaves the tensor empty.
py::array TensorView(const viper::Snapshot& snap, const viper::TensorInfo& tensor, py::handle base) {
  std::vector<py::ssize_t> shape(tensor.shape.begin(), tensor.shape.end());
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(viper::dtype_size(tensor.dtype));
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<py::ssize_t>(shape[i], 1);
  }
  auto bytes = snap.tensor_data(tensor);
  py::array view(NumpyDtype(tensor.dtype), shape, strides, bytes.data(), base);
  view.attr("setflags")(py::arg("write") = false);
  return view;
}

void CopyTensorsInto(const viper::Snapshot& snap,
                     const std::vector<std::tuple<std::string, uintptr_t, uint64_t>>& targets) {
  std::vector<std::pair<std::span<std::byte>, std::span<const std::byte>>> copies;
  copies.reserve(targets.size());
  for (const auto& [name, address, nbytes] : targets) {
    const viper::TensorInfo* t = snap.find(name);
    if (t == nullptr) throw py::key_error(name);
    if (nbytes != t->nbytes() || (nbytes != 0 && address == 0)) {
      Raise(Status::InvalidArgument("tensor '" + name + "': " + std::to_string(nbytes) + " bytes to copy into, the " +
                                    "version has " + std::to_string(t->nbytes())));
    }
    copies.emplace_back(std::span<std::byte>(reinterpret_cast<std::byte*>(address), nbytes), snap.tensor_data(*t));
  }
  py::gil_scoped_release release;
  for (const auto& [dst, src] : copies) viper::StreamingCopy(dst, src);
}

namespace {

std::mutex viewed_mu;
std::multimap<uintptr_t, uintptr_t>& ViewedRanges() {  // begin -> end, one entry per ViewedBuffer
  static auto* ranges = new std::multimap<uintptr_t, uintptr_t>();  // never destroyed: outlives the handles
  return *ranges;
}

}  // namespace

ViewedBuffer::ViewedBuffer(std::span<const std::byte> bytes)
    : begin_(reinterpret_cast<uintptr_t>(bytes.data())), end_(begin_ + bytes.size()) {
  std::lock_guard<std::mutex> lock(viewed_mu);
  if (begin_ != end_) ViewedRanges().emplace(begin_, end_);
}

ViewedBuffer::ViewedBuffer(const ViewedBuffer& other) : begin_(other.begin_), end_(other.end_) {
  std::lock_guard<std::mutex> lock(viewed_mu);
  if (begin_ != end_) ViewedRanges().emplace(begin_, end_);
}

ViewedBuffer::~ViewedBuffer() {
  if (begin_ == end_) return;
  std::lock_guard<std::mutex> lock(viewed_mu);
  auto [first, last] = ViewedRanges().equal_range(begin_);
  for (auto it = first; it != last; ++it) {
    if (it->second == end_) {
      ViewedRanges().erase(it);
      return;
    }
  }
}

int64_t FirstInViewedBuffer(const std::vector<std::pair<uintptr_t, uint64_t>>& ranges) {
  std::lock_guard<std::mutex> lock(viewed_mu);
  const auto& viewed = ViewedRanges();
  for (size_t i = 0; i < ranges.size(); ++i) {
    auto [begin, nbytes] = ranges[i];
    if (nbytes == 0) continue;
    // Buffers beginning before the range's end; one of them overlaps if it ends after its begin.
    for (auto it = viewed.begin(); it != viewed.end() && it->first < begin + nbytes; ++it) {
      if (it->second > begin) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

py::dict TensorDescriptions(const viper::Snapshot& snap) {
  py::dict out;
  for (const auto& t : snap.tensors()) {
    out[py::str(t.name)] = py::make_tuple(std::string(viper::dtype_name(t.dtype)), py::tuple(py::cast(t.shape)));
  }
  return out;
}

HeldTensors HoldTensors(const py::list& items) {
  HeldTensors held;
  held.buffers.reserve(items.size());
  for (py::handle item : items) {
    auto t = item.cast<py::tuple>();
    if (t.size() != 4) Raise(Status::InvalidArgument("internal: tensor entries are (name, dtype, shape, buffer)"));
    viper::TensorData data;
    data.spec.name = t[0].cast<std::string>();
    auto dtype = viper::parse_dtype(t[1].cast<std::string>());
    if (!dtype.ok()) Raise(dtype.status().WithContext("tensor '" + data.spec.name + "'"));
    data.spec.dtype = *dtype;
    data.spec.shape = t[2].cast<std::vector<int64_t>>();
    held.buffers.push_back(t[3].cast<py::buffer>().request());
    const py::buffer_info& info = held.buffers.back();
    uint64_t nbytes = static_cast<uint64_t>(info.size) * static_cast<uint64_t>(info.itemsize);
    data.bytes = std::span<const std::byte>(static_cast<const std::byte*>(info.ptr), nbytes);
    held.tensors.push_back(std::move(data));
  }
  return held;
}

std::map<std::string, std::string> StringMetadata(const py::dict& metadata) {
  std::map<std::string, std::string> out;
  for (auto [key, value] : metadata) {
    std::string k = py::str(key);
    if (k.rfind("viper.", 0) == 0) {
      Raise(Status::InvalidArgument("metadata key '" + k + "': keys starting with 'viper.' are Viper's own"));
    }
    out[k] = py::isinstance<py::str>(value) ? value.cast<std::string>() : std::string(py::str(value));
  }
  return out;
}

}  // namespace viper_py
