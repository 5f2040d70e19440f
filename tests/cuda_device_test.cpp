// CUDA backend, the parts that run on every machine: device discovery never throws, `--device`
// parsing, and the clear errors of a CUDA request without CUDA support or without a device
// (issue #7, acceptance 4). These tests do not skip; they assert whichever case this machine is.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda/cuda_decoder.h"
#include "cuda/cuda_runtime.h"
#include "cuda/device.h"
#include "formats/llama2c_checkpoint.h"
#include "support/process.h"
#include "support/test_data.h"

namespace sq {
namespace {

TEST(CudaDevice, DiscoveryNeverThrows) {
  EXPECT_EQ(cuda_compiled(), SQ_WITH_CUDA == 1);
  int count = -1;
  EXPECT_NO_THROW(count = cuda_device_count());
  EXPECT_GE(count, 0);
  EXPECT_EQ(cuda_available(), count > 0);
  if (!cuda_compiled()) {
    EXPECT_EQ(count, 0);
  }
}

TEST(CudaDevice, SelectDeviceParsesAndRefusesMissingCuda) {
  EXPECT_EQ(select_device("cpu"), Device::Cpu);
  EXPECT_THROW(select_device("gpu"), UsageError);
  if (cuda_available()) {
    EXPECT_EQ(select_device("cuda"), Device::Cuda);
    return;
  }
  try {
    select_device("cuda");
    FAIL() << "select_device(\"cuda\") returned without CUDA";
  } catch (const UnsupportedError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--device cuda"), std::string::npos) << msg;
    const char* expected = cuda_compiled() ? "no CUDA device is available" : "built without CUDA";
    EXPECT_NE(msg.find(expected), std::string::npos) << msg;
  }
}

TEST(CudaDevice, RunnerRefusesToStartWithoutCuda) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present (covered by CudaModel tests)";
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  const Decoder model = Decoder::from_checkpoint(ck);
  EXPECT_THROW(CudaDecoder{model}, UnsupportedError);
  EXPECT_THROW(DeviceArray<float>(16), UnsupportedError);
}

// sq-eval / sq-run --device cuda on a machine without CUDA: one stderr line naming the option, exit 2.
// (With a device the tools run on it: tests/cuda_eval_test.cpp.)
TEST(CudaDevice, ToolsRefuseDeviceCudaWithOneLineExit2) {
  using test::run_process;
  using test::tool;
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present (the tools run on it: CudaEval tests)";
  const auto run = run_process({tool("sq-run"), "-m", test::stories_model(), "--tokenizer", test::stories_tokenizer(), "-p",
                                "Once", "-n", "4", "--device", "cuda"});
  const auto eval = run_process({tool("sq-eval"), "-m", test::stories_model(), "--tokenizer", test::stories_tokenizer(), "-f",
                                 test::tinystories_valid(), "--device", "cuda"});
  for (const auto* r : {&run, &eval}) {
    EXPECT_EQ(r->exit_status, 2) << r->err;
    EXPECT_EQ(std::count(r->err.begin(), r->err.end(), '\n'), 1) << r->err;
    EXPECT_NE(r->err.find("--device cuda"), std::string::npos) << r->err;
    EXPECT_TRUE(r->out.empty()) << r->out;  // refused before the prompt is echoed
  }
  const auto bad = run_process({tool("sq-run"), "-m", test::stories_model(), "-p", "x", "--device", "tpu"});
  EXPECT_EQ(bad.exit_status, 2) << bad.err;
  EXPECT_NE(bad.err.find("--device must be cpu or cuda"), std::string::npos) << bad.err;
}

// sq-bench --suite cuda-gemm without a device: one stderr line naming the suite, exit 2, before any
// other requested suite runs (nothing on stdout).
TEST(CudaDevice, BenchCudaGemmSuiteRefusesWithoutDeviceInOneLine) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present (the suite would run the benchmark)";
  const auto r = test::run_process({test::tool("sq-bench"), "--suite", "fp32,cuda-gemm"});
  EXPECT_EQ(r.exit_status, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--suite cuda-gemm"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// sq-bench --suite cuda-kv-decode without a device (or without CUDA compiled in): one stderr line
// naming the suite, exit 2, nothing on stdout.
TEST(CudaDevice, CudaKvDecodeBenchRefusesWithoutDeviceWithOneLineExit2) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present (the suite would run)";
  const auto r = test::run_process({test::tool("sq-bench"), "--suite", "cuda-kv-decode"});
  EXPECT_EQ(r.exit_status, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--suite cuda-kv-decode"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace
}  // namespace sq
