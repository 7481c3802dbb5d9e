// Placement of a job's worker groups onto devices (docs/design.md §2, Scheduling).
//
// A pure function: given the job and a snapshot of the nodes, it returns one
// Assignment per executor (device) or an error saying why it does not fit.
//  - PACK fills a node before the next; SPREAD deals TP groups round-robin.
//  - A TP group (tp consecutive ranks) never crosses a node.
//  - colocate_with puts rank r of a group on the executor of rank r of the target
//    (verl's hybrid engine): one executor hosts both.
//  - Gang: all executors of the job are placed, or none.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"

namespace tessera::controller {

struct DeviceSlot {
  v1::DeviceType type = v1::DEVICE_TYPE_CPU;
  int index = 0;
  bool free = true;
};

struct NodeView {
  std::string node_id;
  bool schedulable = true;  // READY and not draining
  std::vector<DeviceSlot> devices;
};

// `only_free`: consider only free devices (placing now) or every device of the
// schedulable nodes (can this job ever fit?). Errors are RESOURCE_EXHAUSTED with a
// reason naming the group and the capacity.
absl::StatusOr<std::vector<v1::Assignment>> Place(const v1::JobSpec& spec,
                                                  const std::vector<NodeView>& nodes,
                                                  bool only_free);

}  // namespace tessera::controller
