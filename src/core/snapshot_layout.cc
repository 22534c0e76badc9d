// SnapshotLayout and BuildSnapshot: the writer side of the snapshot format.
//
// The header is rendered twice in a layout's life: at Make, at the widest possible stamp, to
// reserve its space; at WriteHeader/Seal, with the real stamp, padded with spaces to that space.
// The tensor entries and the user metadata are rendered once at Make and reused verbatim.
#include <charconv>
#include <cstring>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "snapshot_internal.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using json = nlohmann::json;
using internal::Quote;

// The viper.* values as they appear in the header. Empty model_json / loss: key omitted.
struct StampText {
  std::string model_json;  // already a JSON string literal, quotes included
  std::string version, step, time_ns, checksum, loss;
};

// The widest stamp: every control character of a model name is escaped as \u00XX (6 bytes);
// u64 has 20 digits; the shortest round-trip double is at most 24 characters
// ("-2.2250738585072014e-308").
StampText WidestStamp() {
  const std::string u64_max = std::to_string(UINT64_MAX);
  return StampText{std::string(2 + 6 * kMaxModelNameBytes, 'x'), u64_max, u64_max, u64_max,
                   std::string(16, 'f'), std::string(24, '9')};
}

std::string FormatLoss(double loss) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), loss);
  return std::string(buffer, end);
}

StampText TextOf(const VersionStamp& stamp) {
  StampText text;
  if (!stamp.model.empty()) text.model_json = json(stamp.model).dump();
  text.version = std::to_string(stamp.version);
  text.step = std::to_string(stamp.step);
  text.time_ns = std::to_string(stamp.time_ns);
  text.checksum = checksum_hex(stamp.checksum);
  if (stamp.loss) text.loss = FormatLoss(*stamp.loss);
  return text;
}

void AppendMeta(std::string& out, std::string_view key, std::string_view value) {
  fmt::format_to(std::back_inserter(out), "\"{}\":\"{}\",", key, value);  // keys and values are plain
}

// {"__metadata__":{<user>,<viper.*>},<tensors>}
std::string RenderHeader(const std::string& user_json, const std::string& tensors_json, uint64_t alignment,
                         const StampText& stamp) {
  std::string out;
  out.reserve(user_json.size() + tensors_json.size() + 1024);
  out += "{\"__metadata__\":{";
  out += user_json;
  if (!user_json.empty()) out += ',';
  if (!stamp.model_json.empty()) fmt::format_to(std::back_inserter(out), "\"{}\":{},", kMetaModel, stamp.model_json);
  AppendMeta(out, kMetaVersion, stamp.version);
  AppendMeta(out, kMetaStep, stamp.step);
  AppendMeta(out, kMetaTimeNs, stamp.time_ns);
  AppendMeta(out, kMetaChecksum, stamp.checksum);
  if (!stamp.loss.empty()) AppendMeta(out, kMetaLoss, stamp.loss);
  fmt::format_to(std::back_inserter(out), "\"{}\":\"{}\"}}", kMetaAlignment, alignment);
  if (!tensors_json.empty()) {
    out += ',';
    out += tensors_json;
  }
  out += '}';
  return out;
}

Status CheckUserMetadata(const std::map<std::string, std::string>& metadata) {
  for (const auto& [key, value] : metadata) {
    if (internal::FirstInvalidUtf8(key) != internal::kNpos) {
      return Status::InvalidArgument("user metadata key is not valid UTF-8");
    }
    if (key.starts_with("viper.")) {
      return Status::InvalidArgument("user metadata key " + Quote(key) + " starts with \"viper.\", which is reserved");
    }
    if (internal::FirstInvalidUtf8(value) != internal::kNpos) {
      return Status::InvalidArgument("user metadata value of key " + Quote(key) + " is not valid UTF-8");
    }
  }
  return Status::OK();
}

std::string RenderUserMetadata(const std::map<std::string, std::string>& metadata) {
  std::string out;
  for (const auto& [key, value] : metadata) {
    if (!out.empty()) out += ',';
    out += json(key).dump() + ":" + json(value).dump();
  }
  return out;
}

Status CheckSpec(const TensorSpec& spec, std::unordered_set<std::string_view>& names) {
  if (spec.name.empty()) return Status::InvalidArgument("tensor name is empty");
  const std::string where = "tensor " + Quote(spec.name);
  if (internal::FirstInvalidUtf8(spec.name) != internal::kNpos) {
    return Status::InvalidArgument(where + ": name is not valid UTF-8");
  }
  if (spec.name == "__metadata__") return Status::InvalidArgument(where + ": name is reserved");
  if (!names.insert(spec.name).second) return Status::InvalidArgument("duplicate tensor name " + Quote(spec.name));
  for (size_t i = 0; i < spec.shape.size(); ++i) {
    if (spec.shape[i] < 0) {
      return Status::InvalidArgument(fmt::format("{}: shape[{}] = {} is negative", where, i, spec.shape[i]));
    }
  }
  return Status::OK();
}

// Places each tensor at the next multiple of `alignment` after the previous one.
Result<std::vector<TensorInfo>> PlaceTensors(const std::vector<TensorSpec>& specs, uint64_t alignment) {
  std::vector<TensorInfo> tensors;
  tensors.reserve(specs.size());
  std::unordered_set<std::string_view> names;
  uint64_t pos = 0;
  for (const TensorSpec& spec : specs) {
    VIPER_RETURN_IF_ERROR(CheckSpec(spec, names));
    const uint64_t begin = internal::RoundUp(pos, alignment);
    const bool fits = internal::StrideSpan(spec.shape, dtype_size(spec.dtype)).has_value();
    const uint64_t nbytes = fits ? *internal::ElementCount(spec.shape) * dtype_size(spec.dtype) : 0;
    if (!fits || begin < pos || begin + nbytes < begin) {
      return Status::InvalidArgument(fmt::format("tensor {}: shape {} of {} overflows a signed 64-bit byte size "
                                                 "(its nonzero dims times the dtype size)",
                                                 Quote(spec.name), internal::ShapeString(spec.shape),
                                                 dtype_name(spec.dtype)));
    }
    tensors.push_back(TensorInfo{spec.name, spec.dtype, spec.shape, begin, begin + nbytes});
    pos = begin + nbytes;
  }
  return tensors;
}

std::string RenderTensors(const std::vector<TensorInfo>& tensors) {
  std::string out;
  for (const TensorInfo& t : tensors) {
    if (!out.empty()) out += ',';
    fmt::format_to(std::back_inserter(out), "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                   json(t.name).dump(), dtype_name(t.dtype), fmt::join(t.shape, ","), t.begin, t.end);
  }
  return out;
}

}  // namespace

Result<SnapshotLayout> SnapshotLayout::Make(std::vector<TensorSpec> tensors,
                                            std::map<std::string, std::string> user_metadata, uint64_t alignment) {
  if (alignment == 0 || alignment > kMaxAlignment || (alignment & (alignment - 1)) != 0) {
    return Status::InvalidArgument(
        fmt::format("alignment {} is not a power of two in [1, {}]", alignment, kMaxAlignment));
  }
  VIPER_RETURN_IF_ERROR(CheckUserMetadata(user_metadata));
  SnapshotLayout layout;
  VIPER_ASSIGN_OR_RETURN(layout.tensors_, PlaceTensors(tensors, alignment));
  layout.alignment_ = alignment;
  layout.user_metadata_ = std::move(user_metadata);
  layout.user_metadata_json_ = RenderUserMetadata(layout.user_metadata_);
  layout.tensors_json_ = RenderTensors(layout.tensors_);
  layout.data_bytes_ = layout.tensors_.empty() ? 0 : layout.tensors_.back().end;
  const std::string widest =
      RenderHeader(layout.user_metadata_json_, layout.tensors_json_, alignment, WidestStamp());
  layout.data_offset_ = internal::RoundUp(8 + widest.size(), 8);
  if (layout.data_bytes_ > UINT64_MAX - layout.data_offset_) {
    return Status::InvalidArgument(fmt::format("snapshot of {} data bytes overflows a 64-bit size", layout.data_bytes_));
  }
  return layout;
}

Result<SnapshotLayout> SnapshotLayout::Of(const Snapshot& snapshot) {
  auto not_viper = [](const std::string& why) {
    return Status::FailedPrecondition("the snapshot is not laid out by Viper (" + why +
                                      "); build a new one from its tensors");
  };
  auto declared = snapshot.meta(kMetaAlignment);
  if (!declared) return not_viper("no " + std::string(kMetaAlignment));
  uint64_t alignment = 0;
  auto [end, ec] = std::from_chars(declared->data(), declared->data() + declared->size(), alignment);
  if (ec != std::errc() || end != declared->data() + declared->size()) return not_viper("bad alignment");
  std::vector<TensorSpec> specs;
  for (const TensorInfo& t : snapshot.tensors()) specs.push_back({t.name, t.dtype, t.shape});
  std::map<std::string, std::string> user;
  for (const auto& [k, v] : snapshot.metadata())
    if (!k.starts_with("viper.")) user.emplace(k, v);
  auto layout = Make(std::move(specs), std::move(user), alignment);
  if (!layout.ok()) return not_viper(layout.status().message());
  if (layout->data_offset() != snapshot.data_offset() || layout->total_bytes() != snapshot.bytes().size())
    return not_viper("header or data size differ from Viper's layout");
  for (size_t i = 0; i < layout->tensors().size(); ++i) {
    if (layout->tensors()[i].begin != snapshot.tensors()[i].begin)
      return not_viper("tensor " + snapshot.tensors()[i].name + " is not where Viper puts it");
  }
  return layout;
}

const TensorInfo* SnapshotLayout::find(std::string_view name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status SnapshotLayout::WriteHeader(std::span<std::byte> dst, const VersionStamp& stamp) const {
  if (dst.size() < data_offset_) {
    return Status::InvalidArgument(
        fmt::format("snapshot header needs {} bytes but the destination has {}", data_offset_, dst.size()));
  }
  if (stamp.model.size() > kMaxModelNameBytes) {
    return Status::InvalidArgument(fmt::format("model name {} is {} bytes; at most {} fit the snapshot header",
                                               Quote(stamp.model), stamp.model.size(), kMaxModelNameBytes));
  }
  if (internal::FirstInvalidUtf8(stamp.model) != internal::kNpos) {
    return Status::InvalidArgument("model name is not valid UTF-8");
  }
  const std::string header = RenderHeader(user_metadata_json_, tensors_json_, alignment_, TextOf(stamp));
  const uint64_t reserved = data_offset_ - 8;
  if (header.size() > reserved) {  // cannot happen: the reserve was rendered at the widest stamp
    return Status::Internal(fmt::format("snapshot header is {} bytes, {} were reserved", header.size(), reserved));
  }
  internal::StoreLe64(dst.data(), reserved);
  std::memcpy(dst.data() + 8, header.data(), header.size());
  std::memset(dst.data() + 8 + header.size(), ' ', reserved - header.size());
  return Status::OK();
}

void SnapshotLayout::ZeroPadding(std::span<std::byte> dst) const {
  uint64_t pos = 0;
  for (const TensorInfo& t : tensors_) {
    uint64_t from = data_offset_ + pos, to = data_offset_ + t.begin;
    if (to > dst.size()) return;  // REQUIRES violated; never write past dst
    if (to > from) std::memset(dst.data() + from, 0, to - from);
    pos = t.end;
  }
}

Status SnapshotLayout::Seal(std::span<std::byte> dst, VersionStamp* stamp) const {
  if (dst.size() < total_bytes()) {
    return Status::InvalidArgument(
        fmt::format("snapshot needs {} bytes but the destination has {}", total_bytes(), dst.size()));
  }
  ZeroPadding(dst);
  stamp->checksum = checksum64(dst.subspan(data_offset_, data_bytes_));
  return WriteHeader(dst, *stamp);
}

Result<Snapshot> BuildSnapshot(const std::vector<TensorData>& tensors, VersionStamp stamp,
                               std::map<std::string, std::string> user_metadata, uint64_t alignment) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorData& t : tensors) specs.push_back(t.spec);
  VIPER_ASSIGN_OR_RETURN(SnapshotLayout layout,
                         SnapshotLayout::Make(std::move(specs), std::move(user_metadata), alignment));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = layout.tensors()[i];
    if (tensors[i].bytes.size() != t.nbytes()) {
      return Status::InvalidArgument(fmt::format("tensor {}: {} bytes given but shape {} of {} is {} bytes",
                                                 Quote(t.name), tensors[i].bytes.size(),
                                                 internal::ShapeString(t.shape), dtype_name(t.dtype), t.nbytes()));
    }
  }
  std::vector<std::byte> buffer(layout.total_bytes());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = layout.tensors()[i];
    if (t.nbytes() > 0) std::memcpy(buffer.data() + layout.data_offset() + t.begin, tensors[i].bytes.data(), t.nbytes());
  }
  VIPER_RETURN_IF_ERROR(layout.Seal(buffer, &stamp));
  return Snapshot::FromBuffer(std::move(buffer));
}

}  // namespace viper
