#include "controller/scheduler.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera::controller {
namespace {

const char* TypeName(v1::DeviceType t) { return t == v1::DEVICE_TYPE_GPU ? "gpu" : "cpu"; }

}  // namespace

absl::StatusOr<std::vector<v1::Assignment>> Place(const v1::JobSpec& spec,
                                                  const std::vector<NodeView>& nodes,
                                                  bool only_free) {
  // Free device indices per node and type; consumed as groups are placed.
  std::vector<std::map<v1::DeviceType, std::vector<int>>> avail(nodes.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (!nodes[n].schedulable) continue;
    for (const auto& d : nodes[n].devices)
      if (d.free || !only_free) avail[n][d.type].push_back(d.index);
  }
  std::vector<v1::Assignment> out;
  std::map<std::string, std::vector<int>> executors_of_group;  // group -> executor per rank

  for (const auto& g : spec.groups()) {
    if (!g.colocate_with().empty()) continue;
    const int tp = std::max(1, g.layout().tp());
    const int units = g.devices() / tp;
    const v1::DeviceType type = g.device_type() == v1::DEVICE_TYPE_GPU ? v1::DEVICE_TYPE_GPU : v1::DEVICE_TYPE_CPU;
    // Number of TP units each node takes.
    std::vector<int> take(nodes.size(), 0);
    auto capacity = [&](size_t n) { return static_cast<int>(avail[n][type].size()) / tp - take[n]; };
    int placed = 0;
    if (g.placement() == v1::PLACEMENT_SPREAD) {
      bool progress = true;
      while (placed < units && progress) {
        progress = false;
        for (size_t n = 0; n < nodes.size() && placed < units; ++n)
          if (capacity(n) > 0) { ++take[n]; ++placed; progress = true; }
      }
    } else {
      for (size_t n = 0; n < nodes.size() && placed < units; ++n) {
        int k = std::min(capacity(n), units - placed);
        if (k > 0) { take[n] += k; placed += k; }
      }
    }
    if (placed < units) {
      std::vector<std::string> caps;
      int total = 0;
      for (size_t n = 0; n < nodes.size(); ++n) {
        if (!nodes[n].schedulable) continue;
        int c = static_cast<int>(avail[n][type].size());
        total += c;
        caps.push_back(absl::StrCat(nodes[n].node_id, ":", c));
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "group '", g.name(), "' needs ", g.devices(), " ", TypeName(type), " devices",
          tp > 1 ? absl::StrCat(" in TP groups of ", tp, " on one node") : std::string(), "; ",
          only_free ? "free now: " : "the cluster has: ", total, " (",
          caps.empty() ? std::string("no schedulable nodes") : absl::StrJoin(caps, ", "), ")"));
    }
    // Ranks in order: node by node, tp-aligned, so TP groups are contiguous on a node.
    std::vector<int>& execs = executors_of_group[g.name()];
    for (size_t n = 0; n < nodes.size(); ++n) {
      auto& free = avail[n][type];
      int count = take[n] * tp;
      for (int i = 0; i < count; ++i) {
        v1::Assignment a;
        a.set_executor(static_cast<int>(out.size()));
        a.set_node_id(nodes[n].node_id);
        a.set_device_type(type);
        a.set_device_index(free[i]);
        execs.push_back(a.executor());
        out.push_back(std::move(a));
      }
      free.erase(free.begin(), free.begin() + count);
    }
    // SPREAD dealt units per node; reorder ranks so that unit u goes to the node of
    // its turn (round-robin), keeping each unit's tp ranks together.
    if (g.placement() == v1::PLACEMENT_SPREAD) {
      std::vector<std::vector<int>> per_node(nodes.size());
      size_t k = 0;
      for (size_t n = 0; n < nodes.size(); ++n)
        for (int u = 0; u < take[n]; ++u)
          for (int t = 0; t < tp; ++t) per_node[n].push_back(execs[k++]);
      std::vector<int> order;
      std::vector<size_t> pos(nodes.size(), 0);
      while (order.size() < execs.size())
        for (size_t n = 0; n < nodes.size(); ++n)
          if (pos[n] < per_node[n].size()) {
            for (int t = 0; t < tp; ++t) order.push_back(per_node[n][pos[n]++]);
          }
      execs = order;
    }
    for (size_t r = 0; r < execs.size(); ++r) {
      auto* gr = out[execs[r]].add_ranks();
      gr->set_group(g.name());
      gr->set_rank(static_cast<int>(r));
    }
  }
  for (const auto& g : spec.groups()) {
    if (g.colocate_with().empty()) continue;
    const auto& execs = executors_of_group[g.colocate_with()];
    for (size_t r = 0; r < execs.size(); ++r) {
      auto* gr = out[execs[r]].add_ranks();
      gr->set_group(g.name());
      gr->set_rank(static_cast<int>(r));
    }
  }
  return out;
}

}  // namespace tessera::controller
