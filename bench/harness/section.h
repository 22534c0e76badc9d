// Parts of `viper bench` beyond the core rows register themselves here, each from its own .cc file
// in bench/harness/ (the harness is an object library: every file's registration is linked in),
// the way the CLI's commands do (tools/viper/command.h):
//
//   namespace viper::bench {
//   namespace {
//   Status DeltaRows(SizeContext& size) { ... size.result.modes.push_back(row); ... }
//   BenchSection delta_section({.name = "delta", .order = 10, .per_size = DeltaRows});
//   }  // namespace
//   }  // namespace viper::bench
//
// A per-size part runs after the core rows of every size; rows it appends to result.modes are
// printed, written to JSON and compared with the file + poll baseline like the core ones, and any
// other figures go to result.sections[name]. A once part runs after every size and the
// notification latency; it prints its own lines and returns its JSON (written under
// "sections"/name). Both add targets through the Report. Parts run in `order`, then by name.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/types.h"
#include "harness/update.h"
#include "viper/status.h"

namespace viper::bench {

// The targets of a run, judged and printed together at the end ("== targets").
class Report {
 public:
  // `at_most`: met when value <= threshold, else when value >= threshold.
  void Target(std::string name, double value, double threshold, bool at_most);
  // Prints every target, one line each, and returns them as JSON.
  nlohmann::json PrintTargets() const;

 private:
  nlohmann::json targets_ = nlohmann::json::array();
};

struct SizeContext {
  const Config& config;
  const SourceModel& model;  // the NT3-shaped tensors of this size, in this process's memory
  SizeResult& result;        // floor, core rows and the file + poll baseline already measured
  Report& report;
};

struct Section {
  std::string name;  // JSON key; also names the part in error messages
  int order = 100;
  std::function<Status(SizeContext&)> per_size;                           // optional
  std::function<Result<nlohmann::json>(const Config&, Report&)> once;    // optional
  // Runs only when named by `viper bench --only NAME` (which then skips the sizes and the
  // notification latency): a long part that most runs do not want.
  bool opt_in = false;
};

std::vector<Section>& sections();  // sorted by (order, name) when the run starts

struct BenchSection {
  explicit BenchSection(Section section) { sections().push_back(std::move(section)); }
};

}  // namespace viper::bench
