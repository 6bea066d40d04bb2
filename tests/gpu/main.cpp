// main.cpp — GPU tests' entry point: exits 77 (CTest: skipped) with the reason
// when there is no CUDA driver or device, so CI shows them as skipped. A
// watchdog (FERRYTEST_WATCHDOG_S, default 240 s per test) names a test that
// hangs and ends the process instead of letting CI time out silently.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

std::atomic<long> g_test_started_ms{0};
std::string g_test_name;  // written by the listener before g_test_started_ms

long now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class WatchdogListener : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo& info) override {
    g_test_name = std::string(info.test_suite_name()) + "." + info.name();
    g_test_started_ms = now_ms();
  }
  void OnTestEnd(const ::testing::TestInfo&) override { g_test_started_ms = 0; }
};

// Why these tests cannot run here, plainly: without any driver the runtime says
// "CUDA driver version is insufficient for CUDA runtime version".
std::string no_gpu_reason(cudaError_t err, int devices) {
  if (err == cudaSuccess) return devices > 0 ? "" : "no CUDA device on this machine (the driver sees none)";
  if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    dlclose(driver);
  } else {
    return "no CUDA driver/device on this machine (libcuda.so.1 not found)";
  }
  if (err == cudaErrorNoDevice) return "no CUDA device on this machine (the driver is installed)";
  if (err == cudaErrorInsufficientDriver)
    return "the CUDA driver here is older than the CUDA " + std::to_string(CUDART_VERSION / 1000) +
           " runtime these tests were built with (cudaErrorInsufficientDriver)";
  return std::string("no usable CUDA device: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (const std::string why = no_gpu_reason(err, n); !why.empty()) {
    std::printf("SKIPPED: the GPU tests need a CUDA device: %s\n", why.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new WatchdogListener);
  const char* env = std::getenv("FERRYTEST_WATCHDOG_S");
  const long limit_ms = (env ? std::atol(env) : 240) * 1000;
  std::thread([limit_ms] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      long started = g_test_started_ms;
      if (started && now_ms() - started > limit_ms) {
        std::fprintf(stderr, "WATCHDOG: %s still running after %ld s: giving up\n", g_test_name.c_str(),
                     limit_ms / 1000);
        std::fflush(stderr);
        std::fflush(stdout);
        std::_Exit(124);
      }
    }
  }).detach();
  return RUN_ALL_TESTS();
}
