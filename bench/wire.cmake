# viper_wire_baseline: the raw TCP stream baseline (owner: hosts). Included from bench/CMakeLists.txt.
add_executable(viper_wire_baseline ${CMAKE_CURRENT_LIST_DIR}/wire_baseline.cc)
target_link_libraries(viper_wire_baseline PRIVATE viper_core CLI11::CLI11 fmt::fmt Threads::Threads)
set_target_properties(viper_wire_baseline PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
