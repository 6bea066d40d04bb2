// numa_placement_test.cpp — each device's engine serves it from the host NUMA
// node sysfs gives its PCI device (none on a one-node host), uses that node's
// crew, and still copies correctly through its (node-bound) staging memory.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "copy/copy_crew.h"
#include "pool/numa_home.h"
#include "core/crew.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/device.h"
#include "os/sysfs.h"
#include "test_buffers.h"

namespace ferry::cuda {
namespace {

using namespace ferry::cuda::testing;

TEST(NumaPlacement, EachEngineServesItsDeviceFromItsSysfsNode) {
  int count = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  std::vector<int> online;
  const bool numa = os::read_online_nodes(&online) == 0;
  for (int d = 0; d < count; ++d) {
    const std::string bus = pci_bus_id(d);
    const std::string name = os::normalize_pci_bus_id(bus);
    ASSERT_FALSE(name.empty()) << "device " << d << ": bus id '" << bus << "'";
    std::ifstream in("/sys/bus/pci/devices/" + name + "/numa_node");
    int sysfs_node = -1;  // no file: unknown
    if (in) in >> sysfs_node;
    const bool several = numa && online.size() > 1;
    const int want = several ? numa_home(sysfs_node, online) : -1;
    std::fprintf(stderr, "  device %d at %s: sysfs numa_node %d, %zu online node(s) -> engine node %d\n", d,
                 name.c_str(), sysfs_node, numa ? online.size() : 0, want);

    CopyEngine engine(CopyEngineOptions::from_environment(d));
    EXPECT_EQ(engine.numa_node(), want) << "device " << d;
    EXPECT_EQ(&engine.crew(), &copy_crew(want)) << "device " << d << " does not use its node's crew";
    if (want < 0) {
      EXPECT_TRUE(engine.crew().cpus().empty()) << "device " << d << ": a one-node crew is bound";
    }

    // Staged copies through the node's staging memory and crew, both directions.
    const size_t n = 9 * MiB + 5;
    CUDA_OK(cudaSetDevice(d));
    HostBuffer src(n), dst(n);
    DeviceBuffer dev(n);
    fill_random(src.p, n, 77 + d);
    std::memset(dst.p, 0xEE, dst.n);
    CUDA_OK(cudaMemset(dev.p, 0xCD, n));
    engine.copy(dev.p, src.p, n, nullptr, Strategy::staged);
    engine.copy(dst.p, dev.p, n, nullptr, Strategy::staged);
    EXPECT_EQ(std::memcmp(src.p, dst.p, n), 0) << "device " << d;
    EXPECT_EQ(dst.p[n], 0xEE) << "device " << d << ": wrote past the destination";
  }
  CUDA_OK(cudaSetDevice(0));
}

}  // namespace
}  // namespace ferry::cuda
