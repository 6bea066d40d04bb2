// numa_home.h — the host NUMA node that serves a GPU: the node sysfs gives
// its PCI device (/sys/bus/pci/devices/<bus id>/numa_node), on hosts with
// several nodes. The copy engine of that GPU runs its staging memcpys on the
// node's crew (copy/copy_crew.h) and binds its pinned staging memory there.
//
// Not cudaDevAttrNumaId: that is the node of the GPU's own memory on
// platforms where it is one (Grace Hopper), not the host node nearest the GPU.
#pragma once

#include <string_view>
#include <vector>

namespace ferry {

// The numa_node sysfs gives the PCI device at `bus_id` ("00000000:0A:00.0",
// as cudaDeviceGetPCIBusId writes it, or the sysfs form "0000:0a:00.0"); -1
// when the firmware names none or sysfs has no such device. Throws
// InvalidArgument, quoting it, for a bus id that is not a PCI address.
int pci_numa_node(std::string_view bus_id);

// The node that serves a device whose PCI node is `pci_node`: pci_node when
// `online_nodes` has several nodes and pci_node is one of them, else -1 (no
// placement: one crew, memory wherever the kernel puts it).
int numa_home(int pci_node, const std::vector<int>& online_nodes);

// numa_home() of the device at `bus_id` on this host. Throws like pci_numa_node.
int numa_home(std::string_view bus_id);

}  // namespace ferry
