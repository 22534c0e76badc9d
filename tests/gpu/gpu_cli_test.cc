// `viper bench --gpu` on a machine without a usable CUDA driver (CTest sets
// VIPER_CUDA_LIBRARY=/nonexistent/libcuda.so.1): one clear line and exit 1; wrong combinations of
// flags are refused with exit 2 before the driver is touched.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "cli/run_viper.h"

namespace viper {
namespace {

class GpuCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("viper-gpu-cli-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(GpuCli, BenchGpuWithoutADriverSaysWhatIsMissing) {
  ASSERT_NE(std::getenv("VIPER_CUDA_LIBRARY"), nullptr) << "run through ctest";
  auto r = testing::RunViper({"bench", "--gpu", "--sizes", "1Mi"}, dir_);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("viper bench: GPU: /nonexistent/libcuda.so.1 not found"), std::string::npos) << r.err;
}

TEST_F(GpuCli, BenchGpuRefusesOtherBenchmarksAndBadSizes) {
  auto r = testing::RunViper({"bench", "--gpu", "--fanout"}, dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--gpu runs alone"), std::string::npos) << r.err;
  r = testing::RunViper({"bench", "--gpu", "--sizes", "0"}, dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("size '0' must be more than 0 bytes"), std::string::npos) << r.err;
  r = testing::RunViper({"bench", "--gpu", "--reps", "0"}, dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--reps: '0' must be an integer from 1 to 1000000"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace viper
