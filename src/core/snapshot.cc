// Snapshot: dtypes and the strict parser of safetensors buffers (the writer is snapshot_layout.cc).
//
// The parser is the first code that touches untrusted bytes. Every fault is Corruption with its
// own message; the list lives in docs/ARCHITECTURE.md ("Snapshot format and alignment").
#include "viper/snapshot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/fd.h"
#include "snapshot_internal.h"

namespace viper {
namespace {

using json = nlohmann::json;
using internal::Quote;

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};
// Indexed by the enum value.
constexpr DTypeEntry kDTypeTable[] = {
    {DType::kF64, "F64", 8},  {DType::kF32, "F32", 4},  {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8},  {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},  {DType::kI8, "I8", 1},    {DType::kU64, "U64", 8},
    {DType::kU32, "U32", 4},  {DType::kU16, "U16", 2},  {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1}, {DType::kF8_E4M3, "F8_E4M3", 1}, {DType::kF8_E5M2, "F8_E5M2", 1},
};
static_assert(std::size(kDTypeTable) == std::size(kAllDTypes));

constexpr size_t kMaxJsonDepth = 64;  // a valid header nests 3 deep (object, entry, shape)

Status Fault(std::string message) { return Status::Corruption(std::move(message)); }

// "array", "string", "number -1.5", ...: what a JSON value is, without quoting untrusted text.
std::string Describe(const json& value) {
  if (value.is_number()) return "number " + value.dump();
  return value.type_name();
}

// Builds the header's JSON value from the parser's events, stopping at the first duplicate key
// (nlohmann::json would keep one of the two silently) or at excessive nesting, and naming the
// tensor or metadata entry a duplicate belongs to. A parse callback could check the same, but
// nlohmann then rescans the parent object each time an object closes: quadratic in the tensors.
class HeaderBuilder final : public nlohmann::json_sax<json> {
 public:
  json Take() { return std::move(root_); }
  const std::string& fault() const { return fault_; }

  bool null() override { return Value(nullptr); }
  bool boolean(bool value) override { return Value(value); }
  bool number_integer(number_integer_t value) override { return Value(value); }
  bool number_unsigned(number_unsigned_t value) override { return Value(value); }
  bool number_float(number_float_t value, const string_t&) override { return Value(value); }
  bool string(string_t& value) override { return Value(std::move(value)); }
  bool binary(binary_t& value) override { return Value(json::binary(std::move(value))); }
  bool start_object(std::size_t) override { return Open(json::object()); }
  bool start_array(std::size_t) override { return Open(json::array()); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }

  bool key(string_t& key) override {
    Frame& frame = frames_.back();
    auto [it, inserted] = frame.value->get_ref<json::object_t&>().emplace(std::move(key), nullptr);
    if (!inserted) {
      fault_ = DuplicateMessage(it->first);
      return false;
    }
    frame.last_key = &it->first;
    next_ = &it->second;
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    std::string what = e.what();
    if (what.size() > 200) what = what.substr(0, 200) + "...";  // "last read:" may quote a long token
    fault_ = "header is not valid JSON: " + what;
    return false;
  }

 private:
  struct Frame {
    json* value;                            // the object or array being filled
    std::string name;                       // the key it is the value of
    const std::string* last_key = nullptr;  // in value's map, where it stays while value lives
  };

  // Stores `value` where the parser is (the root, the next array element, or the value of the
  // last key) and returns where it went.
  json* Add(json value) {
    if (frames_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    json& parent = *frames_.back().value;
    if (parent.is_array()) {
      parent.get_ref<json::array_t&>().push_back(std::move(value));
      return &parent.get_ref<json::array_t&>().back();
    }
    *next_ = std::move(value);
    return next_;
  }

  bool Value(json value) {
    Add(std::move(value));
    return true;
  }

  bool Open(json empty) {
    if (frames_.size() >= kMaxJsonDepth) {
      fault_ = fmt::format("header JSON nests deeper than {} levels", kMaxJsonDepth);
      return false;
    }
    const std::string* key = frames_.empty() ? nullptr : frames_.back().last_key;
    std::string name = key == nullptr ? std::string() : *key;
    json* slot = Add(std::move(empty));
    frames_.push_back(Frame{slot, std::move(name)});
    return true;
  }

  bool Close() {
    frames_.pop_back();
    return true;
  }

  std::string DuplicateMessage(const std::string& key) const {
    if (frames_.size() == 1) {
      return key == "__metadata__" ? "duplicate key \"__metadata__\"" : "duplicate tensor name " + Quote(key);
    }
    const std::string& parent = frames_.back().name;
    if (frames_.size() == 2 && parent == "__metadata__") return "__metadata__: duplicate key " + Quote(key);
    if (frames_.size() == 2) return "tensor " + Quote(parent) + ": duplicate field " + Quote(key);
    return "duplicate key " + Quote(key) + " in header JSON";
  }

  json root_;
  std::vector<Frame> frames_;
  json* next_ = nullptr;  // the value slot of the last key
  std::string fault_;
};

Result<json> ParseHeaderJson(std::string_view text) {
  HeaderBuilder builder;
  if (!json::sax_parse(text.begin(), text.end(), &builder)) return Fault(builder.fault());
  return builder.Take();
}

Result<DType> ParseDTypeField(const std::string& where, const json& value) {
  if (!value.is_string()) return Fault(where + ": field \"dtype\" must be a string, got " + Describe(value));
  const auto& name = value.get_ref<const std::string&>();
  auto dtype = parse_dtype(name);
  if (!dtype.ok()) return Fault(where + ": unknown dtype " + Quote(name));
  return *dtype;
}

// A non-negative integer that fits u64 (nlohmann stores those as number_unsigned; "-0" as 0).
std::optional<uint64_t> AsU64(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() == 0) return 0;
  return std::nullopt;
}

// The message for an element that is not a non-negative integer.
std::string NotU64(const std::string& at, const json& value) {
  if (value.is_number_integer()) return fmt::format("{} = {} is negative", at, value.get<int64_t>());
  return at + " must be a non-negative integer, got " + Describe(value);
}

Result<std::vector<int64_t>> ParseShape(const std::string& where, const json& value) {
  if (!value.is_array()) return Fault(where + ": field \"shape\" must be an array, got " + Describe(value));
  std::vector<int64_t> shape;
  shape.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string at = fmt::format("{}: shape[{}]", where, i);
    std::optional<uint64_t> dim = AsU64(value[i]);
    if (!dim) return Fault(NotU64(at, value[i]));
    if (*dim > static_cast<uint64_t>(INT64_MAX)) return Fault(fmt::format("{} = {} is larger than 2^63-1", at, *dim));
    shape.push_back(static_cast<int64_t>(*dim));
  }
  return shape;
}

Result<std::pair<uint64_t, uint64_t>> ParseOffsets(const std::string& where, const json& value) {
  if (!value.is_array() || value.size() != 2) {
    std::string got = value.is_array() ? fmt::format("an array of {}", value.size()) : Describe(value);
    return Fault(where + ": field \"data_offsets\" must be an array of 2 integers, got " + got);
  }
  std::optional<uint64_t> bounds[2];
  for (size_t i = 0; i < 2; ++i) {
    bounds[i] = AsU64(value[i]);
    if (!bounds[i]) return Fault(NotU64(fmt::format("{}: data_offsets[{}]", where, i), value[i]));
  }
  return std::pair{*bounds[0], *bounds[1]};
}

// Offsets in range, byte size without overflow and equal to the span of the offsets.
Status CheckTensorExtent(const std::string& where, const TensorInfo& t, uint64_t data_size) {
  const std::string offsets = fmt::format("data_offsets [{}, {}]", t.begin, t.end);
  if (t.begin > t.end) return Fault(fmt::format("{}: {} have begin > end", where, offsets));
  if (t.end > data_size) {
    return Fault(fmt::format("{}: {} end beyond the data region of {} bytes", where, offsets, data_size));
  }
  const std::string what = fmt::format("shape {} of {}", internal::ShapeString(t.shape), dtype_name(t.dtype));
  if (!internal::StrideSpan(t.shape, dtype_size(t.dtype))) {
    if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) {
      return Fault(fmt::format("{}: {} has no elements, but its other dims span more than 2^63-1 bytes (a view's "
                               "strides would overflow)", where, what));
    }
    return Fault(fmt::format("{}: {} is more than 2^63-1 bytes", where, what));
  }
  const uint64_t nbytes = *internal::ElementCount(t.shape) * dtype_size(t.dtype);  // within the span
  if (nbytes > data_size) {
    return Fault(fmt::format("{}: {} needs {} bytes but the data region has only {}", where, what, nbytes, data_size));
  }
  if (nbytes != t.end - t.begin) {
    return Fault(fmt::format("{}: {} is {} bytes but {} span {} bytes", where, what, nbytes, offsets, t.end - t.begin));
  }
  return Status::OK();
}

constexpr std::string_view kTensorFields[] = {"dtype", "shape", "data_offsets"};

Status CheckTensorFields(const std::string& where, const json& entry) {
  if (!entry.is_object()) return Fault(where + ": entry must be an object, got " + Describe(entry));
  for (std::string_view field : kTensorFields) {
    if (!entry.contains(field)) return Fault(where + ": missing field " + Quote(field));
  }
  for (const auto& [key, value] : entry.items()) {
    if (std::find(std::begin(kTensorFields), std::end(kTensorFields), key) == std::end(kTensorFields)) {
      return Fault(where + ": unknown field " + Quote(key) + " (a tensor entry has only dtype, shape, data_offsets)");
    }
  }
  return Status::OK();
}

Result<TensorInfo> ParseTensor(const std::string& name, const json& entry, uint64_t data_size) {
  const std::string where = "tensor " + Quote(name);
  VIPER_RETURN_IF_ERROR(CheckTensorFields(where, entry));
  TensorInfo t;
  t.name = name;
  VIPER_ASSIGN_OR_RETURN(t.dtype, ParseDTypeField(where, entry.at("dtype")));
  VIPER_ASSIGN_OR_RETURN(t.shape, ParseShape(where, entry.at("shape")));
  VIPER_ASSIGN_OR_RETURN(auto offsets, ParseOffsets(where, entry.at("data_offsets")));
  t.begin = offsets.first;
  t.end = offsets.second;
  VIPER_RETURN_IF_ERROR(CheckTensorExtent(where, t, data_size));
  return t;
}

Result<std::map<std::string, std::string>> ParseMetadata(const json& header) {
  std::map<std::string, std::string> metadata;
  auto it = header.find("__metadata__");
  if (it == header.end()) return metadata;
  if (!it->is_object()) return Fault("\"__metadata__\" must be an object, got " + Describe(*it));
  for (const auto& [key, value] : it->items()) {
    if (!value.is_string()) {
      return Fault("__metadata__ key " + Quote(key) + ": value must be a string, got " + Describe(value));
    }
    metadata.emplace(key, value.get<std::string>());
  }
  return metadata;
}

// The declared viper.alignment, 0 if absent. A present viper.checksum must be well-formed.
Result<uint64_t> CheckViperKeys(const std::map<std::string, std::string>& metadata) {
  if (auto it = metadata.find(std::string(kMetaChecksum)); it != metadata.end()) {
    auto parsed = parse_checksum_hex(it->second);
    if (!parsed.ok()) return parsed.status().WithContext("__metadata__ key \"viper.checksum\"");
  }
  auto it = metadata.find(std::string(kMetaAlignment));
  if (it == metadata.end()) return uint64_t{0};
  uint64_t alignment = 0;
  const std::string& text = it->second;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), alignment);
  bool valid = ec == std::errc() && end == text.data() + text.size() && alignment >= 1 &&
               alignment <= kMaxAlignment && (alignment & (alignment - 1)) == 0;
  if (!valid) {
    return Fault(fmt::format("__metadata__ key \"viper.alignment\": {} is not a power of two in [1, {}]",
                             Quote(text), kMaxAlignment));
  }
  return alignment;
}

// Every entry but __metadata__, sorted into data order.
Result<std::vector<TensorInfo>> ParseTensors(const json& header, uint64_t data_size) {
  std::vector<TensorInfo> tensors;
  tensors.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    VIPER_ASSIGN_OR_RETURN(TensorInfo t, ParseTensor(name, entry, data_size));
    tensors.push_back(std::move(t));
  }
  std::stable_sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  return tensors;
}

std::string GapMessage(const TensorInfo* prev, const TensorInfo& t, uint64_t pos, uint64_t alignment) {
  std::string message =
      prev == nullptr
          ? fmt::format("gap of {} bytes at the start of the data region, before tensor {} (begins at {})",
                        t.begin, Quote(t.name), t.begin)
          : fmt::format("gap of {} bytes between tensor {} (ends at {}) and tensor {} (begins at {})",
                        t.begin - pos, Quote(prev->name), pos, Quote(t.name), t.begin);
  if (alignment == 0) return message + "; a gap is allowed only as the padding of a declared viper.alignment";
  return message + fmt::format("; with viper.alignment {} it must begin at {} or {}", alignment, pos,
                               internal::RoundUp(pos, alignment));
}

// Sorted tensors must tile the data region: no overlap, no gap other than declared alignment
// padding, nothing after the last tensor.
Status CheckLayout(const std::vector<TensorInfo>& tensors, uint64_t data_size, uint64_t alignment) {
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : tensors) {
    if (t.begin < pos) {
      return Fault(fmt::format("tensors {} [{}, {}) and {} [{}, {}) overlap", Quote(prev->name), prev->begin,
                               prev->end, Quote(t.name), t.begin, t.end));
    }
    bool padded = alignment > 1 && t.begin == internal::RoundUp(pos, alignment);
    if (t.begin > pos && !padded) return Fault(GapMessage(prev, t, pos, alignment));
    pos = t.end;
    prev = &t;
  }
  if (pos != data_size) {
    return Fault(fmt::format("data region has {} bytes but the tensors cover only the first {}: {} trailing bytes",
                             data_size, pos, data_size - pos));
  }
  return Status::OK();
}

std::vector<uint32_t> IndexByName(const std::vector<TensorInfo>& tensors) {
  std::vector<uint32_t> index(tensors.size());
  for (uint32_t i = 0; i < index.size(); ++i) index[i] = i;
  std::sort(index.begin(), index.end(), [&](uint32_t a, uint32_t b) { return tensors[a].name < tensors[b].name; });
  return index;
}

std::optional<uint64_t> ParseU64(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size()) return std::nullopt;
  return value;
}

std::string MismatchMessage(uint64_t declared, const Snapshot& snapshot, uint64_t computed) {
  return fmt::format("checksum mismatch: viper.checksum is {} but the data region ({} bytes) hashes to {}",
                     checksum_hex(declared), snapshot.data_region().size(), checksum_hex(computed));
}

// What a buffer whose header length failed is, where it is a torch.save file: a zip archive
// (torch >= 1.6) or a pickle (before). Its first 8 bytes read as a length are nonsense.
std::optional<std::string> TorchSaveMessage(std::span<const std::byte> bytes) {
  const auto at = [&](size_t i) { return std::to_integer<uint8_t>(bytes[i]); };
  std::string what;
  if (at(0) == 'P' && at(1) == 'K' && at(2) == 3 && at(3) == 4) {
    what = "a zip archive's signature, as a torch.save file does";
  } else if (at(0) == 0x80 && at(1) >= 2 && at(1) <= 5) {
    what = fmt::format("a pickle's protocol {} opcode, as a legacy torch.save file does", at(1));
  } else {
    return std::nullopt;
  }
  return "not a safetensors file: it begins with " + what +
         "; convert it with safetensors.torch.save_file(torch.load(path), \"model.safetensors\"), or publish "
         "the state_dict from Python with viper.Publisher(model).publish(torch.load(path))";
}

}  // namespace

size_t dtype_size(DType dtype) { return kDTypeTable[static_cast<size_t>(dtype)].size; }

std::string_view dtype_name(DType dtype) { return kDTypeTable[static_cast<size_t>(dtype)].name; }

Result<DType> parse_dtype(std::string_view name) {
  for (const DTypeEntry& entry : kDTypeTable) {
    if (entry.name == name) return entry.dtype;
  }
  return Status::InvalidArgument("unknown dtype " + Quote(name));
}

uint64_t TensorInfo::num_elements() const { return internal::ElementCount(shape).value_or(0); }

Result<Snapshot> Snapshot::Parse(std::span<const std::byte> bytes, std::shared_ptr<const void> owner,
                                 const ParseOptions& options) {
  if (bytes.size() < 8) {
    return Fault(fmt::format("buffer is {} bytes, shorter than the 8-byte header length prefix", bytes.size()));
  }
  const uint64_t n = internal::LoadLe64(bytes.data());
  if (n > options.max_header_bytes || n > bytes.size() - 8) {
    if (std::optional<std::string> torch = TorchSaveMessage(bytes)) return Fault(*torch);
  }
  if (n > options.max_header_bytes) {
    return Fault(fmt::format("header length {} exceeds the limit of {} bytes (ParseOptions.max_header_bytes)", n,
                             options.max_header_bytes));
  }
  if (n > bytes.size() - 8) {
    return Fault(fmt::format("header length {} runs past the end of the buffer: only {} bytes follow the 8-byte prefix",
                             n, bytes.size() - 8));
  }
  std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  if (size_t bad = internal::FirstInvalidUtf8(text); bad != internal::kNpos) {
    return Fault(fmt::format("header is not valid UTF-8: byte 0x{:02x} at header offset {}",
                             static_cast<unsigned char>(text[bad]), bad));
  }
  VIPER_ASSIGN_OR_RETURN(json header, ParseHeaderJson(text));
  if (!header.is_object()) return Fault("header JSON must be an object, got " + Describe(header));

  Snapshot snapshot;
  const uint64_t data_size = bytes.size() - 8 - n;
  VIPER_ASSIGN_OR_RETURN(snapshot.metadata_, ParseMetadata(header));
  VIPER_ASSIGN_OR_RETURN(uint64_t alignment, CheckViperKeys(snapshot.metadata_));
  VIPER_ASSIGN_OR_RETURN(snapshot.tensors_, ParseTensors(header, data_size));
  VIPER_RETURN_IF_ERROR(CheckLayout(snapshot.tensors_, data_size, alignment));
  snapshot.by_name_ = IndexByName(snapshot.tensors_);
  snapshot.bytes_ = bytes;
  snapshot.owner_ = std::move(owner);
  snapshot.data_offset_ = 8 + n;

  if (options.require_checksum && !snapshot.metadata_.contains(std::string(kMetaChecksum))) {
    return Fault("no viper.checksum in __metadata__ (ParseOptions.require_checksum is set)");
  }
  if (options.verify_checksum && snapshot.declared_checksum()) VIPER_RETURN_IF_ERROR(snapshot.VerifyChecksum());
  return snapshot;
}

Result<uint64_t> SnapshotExtent(std::span<const std::byte> bytes, const ParseOptions& options) {
  if (bytes.size() < 8) return Fault(fmt::format("buffer is {} bytes, shorter than the 8-byte header length prefix", bytes.size()));
  const uint64_t n = internal::LoadLe64(bytes.data());
  if (n > options.max_header_bytes || n > bytes.size() - 8)
    return Fault(fmt::format("header length {} exceeds the buffer ({} bytes) or the limit ({} bytes)", n, bytes.size(),
                             options.max_header_bytes));
  std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  if (internal::FirstInvalidUtf8(text) != internal::kNpos) return Fault("header is not valid UTF-8");
  VIPER_ASSIGN_OR_RETURN(json header, ParseHeaderJson(text));
  if (!header.is_object()) return Fault("header JSON must be an object, got " + Describe(header));
  VIPER_ASSIGN_OR_RETURN(std::vector<TensorInfo> tensors, ParseTensors(header, bytes.size() - 8 - n));
  uint64_t end = 0;
  for (const TensorInfo& t : tensors) end = std::max(end, t.end);
  return 8 + n + end;
}

Result<SnapshotHeader> ParseSnapshotHeader(std::span<const std::byte> header, uint64_t data_bytes,
                                           const ParseOptions& options) {
  if (header.size() < 8) return Fault(fmt::format("header is {} bytes, shorter than the 8-byte length prefix", header.size()));
  const uint64_t n = internal::LoadLe64(header.data());
  if (n > options.max_header_bytes || n > header.size() - 8)
    return Fault(fmt::format("header length {} exceeds the {} bytes given or the limit ({} bytes)", n, header.size() - 8,
                             options.max_header_bytes));
  std::string_view text(reinterpret_cast<const char*>(header.data()) + 8, n);
  if (internal::FirstInvalidUtf8(text) != internal::kNpos) return Fault("header is not valid UTF-8");
  VIPER_ASSIGN_OR_RETURN(json parsed, ParseHeaderJson(text));
  if (!parsed.is_object()) return Fault("header JSON must be an object, got " + Describe(parsed));
  SnapshotHeader out;
  out.data_offset = 8 + n;
  VIPER_ASSIGN_OR_RETURN(out.metadata, ParseMetadata(parsed));
  VIPER_ASSIGN_OR_RETURN(uint64_t alignment, CheckViperKeys(out.metadata));
  VIPER_ASSIGN_OR_RETURN(out.tensors, ParseTensors(parsed, data_bytes));
  VIPER_RETURN_IF_ERROR(CheckLayout(out.tensors, data_bytes, alignment));
  return out;
}

Result<Snapshot> Snapshot::FromBuffer(std::vector<std::byte> bytes, const ParseOptions& options) {
  auto holder = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  std::span<const std::byte> view(*holder);
  return Parse(view, std::move(holder), options);
}

namespace {

// A read-only private mapping of the whole file, unmapped when the last owner goes.
Result<std::shared_ptr<const void>> MapFile(const std::string& path, size_t* size) {
  struct stat st {};
  VIPER_ASSIGN_OR_RETURN(Fd fd, OpenRegularFile(path, &st));
  *size = static_cast<size_t>(st.st_size);
  if (*size == 0) return std::shared_ptr<const void>();  // mmap refuses length 0; Parse reports the short buffer
  void* addr = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, fd.get(), 0);  // the mapping keeps the file
  if (addr == MAP_FAILED) return Status::FromErrno(fmt::format("mmap of {} bytes failed", *size));
  size_t length = *size;
  return std::shared_ptr<const void>(addr, [length](const void* p) { ::munmap(const_cast<void*>(p), length); });
}

}  // namespace

Result<Snapshot> Snapshot::OpenFile(const std::filesystem::path& path, const ParseOptions& options) {
  size_t size = 0;
  auto mapping = MapFile(path.string(), &size);
  if (!mapping.ok()) return mapping.status().WithContext(path.string());
  std::span<const std::byte> view(static_cast<const std::byte*>(mapping->get()), size);
  auto snapshot = Parse(view, std::move(*mapping), options);
  if (!snapshot.ok()) return snapshot.status().WithContext(path.string());
  return snapshot;
}

const TensorInfo* Snapshot::find(std::string_view name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&](uint32_t i, std::string_view key) { return tensors_[i].name < key; });
  if (it == by_name_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

std::span<const std::byte> Snapshot::tensor_data(const TensorInfo& tensor) const {
  return bytes_.subspan(data_offset_ + tensor.begin, tensor.nbytes());
}

std::optional<std::string> Snapshot::meta(std::string_view key) const {
  auto it = metadata_.find(std::string(key));
  if (it == metadata_.end()) return std::nullopt;
  return it->second;
}

std::optional<uint64_t> Snapshot::version() const { return ParseU64(meta(kMetaVersion)); }
std::optional<uint64_t> Snapshot::step() const { return ParseU64(meta(kMetaStep)); }
std::optional<uint64_t> Snapshot::time_ns() const { return ParseU64(meta(kMetaTimeNs)); }

std::optional<double> Snapshot::loss() const {
  std::optional<std::string> text = meta(kMetaLoss);
  if (!text) return std::nullopt;
  double value = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size()) return std::nullopt;
  return value;
}

std::optional<uint64_t> Snapshot::declared_checksum() const {
  std::optional<std::string> text = meta(kMetaChecksum);
  if (!text) return std::nullopt;
  auto value = parse_checksum_hex(*text);  // well-formed: Parse checked it
  if (!value.ok()) return std::nullopt;
  return *value;
}

Status Snapshot::VerifyChecksum() const {
  std::optional<uint64_t> declared = declared_checksum();
  if (!declared) return Status::NotFound("no viper.checksum in __metadata__");
  uint64_t computed = compute_checksum();
  if (computed != *declared) return Status::Corruption(MismatchMessage(*declared, *this, computed));
  return Status::OK();
}

}  // namespace viper
