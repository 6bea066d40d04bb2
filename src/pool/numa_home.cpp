// numa_home.cpp — a GPU's host NUMA node from sysfs.
#include "pool/numa_home.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "os/sysfs.h"

namespace ferry {

int pci_numa_node(std::string_view bus_id) {
  if (os::normalize_pci_bus_id(bus_id).empty())
    throw InvalidArgument("PCI bus id '" + std::string(bus_id) +
                          "': expected [domain:]bus:device.function in hex, such as 0000:0a:00.0");
  int node = -1;
  return os::read_pci_numa_node(bus_id, &node) == 0 ? node : -1;
}

int numa_home(int pci_node, const std::vector<int>& online_nodes) {
  if (pci_node < 0 || online_nodes.size() < 2) return -1;
  return std::find(online_nodes.begin(), online_nodes.end(), pci_node) != online_nodes.end() ? pci_node : -1;
}

int numa_home(std::string_view bus_id) {
  const int pci_node = pci_numa_node(bus_id);
  std::vector<int> online;
  if (os::read_online_nodes(&online) != 0) return -1;
  return numa_home(pci_node, online);
}

}  // namespace ferry
