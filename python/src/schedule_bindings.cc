// Placeholder until the scheduler bindings land (issue 6; being written by another engineer).
#include "bindings.h"

namespace viper_py {
void BindSchedule(py::module_&) {}
}  // namespace viper_py
