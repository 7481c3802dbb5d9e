#include "controller/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/spec/job_spec.h"

namespace tessera::controller {
namespace {

using ::testing::HasSubstr;

NodeView Node(const std::string& id, int cpus, int used = 0) {
  NodeView n;
  n.node_id = id;
  for (int i = 0; i < cpus; ++i) n.devices.push_back({v1::DEVICE_TYPE_CPU, i, i >= used});
  return n;
}

v1::JobSpec Spec(int devices, int tp, v1::Placement p = v1::PLACEMENT_PACK) {
  v1::JobSpec s;
  s.set_name("j");
  s.set_kind("comm-check");
  auto* g = s.add_groups();
  g->set_name("actor");
  g->set_devices(devices);
  g->set_placement(p);
  g->mutable_layout()->set_tp(tp);
  EXPECT_TRUE(NormalizeAndValidateJobSpec(s).ok());
  return s;
}

std::vector<std::string> NodesOf(const std::vector<v1::Assignment>& as, const std::string& group) {
  std::vector<std::string> by_rank;
  for (const auto& a : as)
    for (const auto& r : a.ranks())
      if (r.group() == group) {
        if (static_cast<int>(by_rank.size()) <= r.rank()) by_rank.resize(r.rank() + 1);
        by_rank[r.rank()] = a.node_id();
      }
  return by_rank;
}

TEST(Scheduler, PackFillsANodeFirst) {
  auto p = Place(Spec(4, 1), {Node("a", 4), Node("b", 4)}, true);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesOf(*p, "actor"), (std::vector<std::string>{"a", "a", "a", "a"}));
}

TEST(Scheduler, SpreadDealsTpGroupsRoundRobin) {
  auto p = Place(Spec(8, 2, v1::PLACEMENT_SPREAD), {Node("a", 4), Node("b", 4)}, true);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesOf(*p, "actor"), (std::vector<std::string>{"a", "a", "b", "b", "a", "a", "b", "b"}));
}

TEST(Scheduler, TpGroupNeverCrossesANode) {
  // 3 free slots per node: a tp=2 group fits once per node, so 4 devices use both nodes
  // and the third slot of each node stays empty.
  auto p = Place(Spec(4, 2), {Node("a", 4, 1), Node("b", 4, 1)}, true);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesOf(*p, "actor"), (std::vector<std::string>{"a", "a", "b", "b"}));
  // tp=4 cannot fit in 3 free slots anywhere.
  auto q = Place(Spec(4, 4), {Node("a", 4, 1), Node("b", 4, 1)}, true);
  EXPECT_EQ(q.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(q.status().message()), HasSubstr("needs 4 cpu devices in TP groups of 4 on one node"));
}

TEST(Scheduler, NeverFitsVersusNotNow) {
  std::vector<NodeView> nodes = {Node("a", 4, 4), Node("b", 4, 4)};
  EXPECT_FALSE(Place(Spec(8, 1), nodes, true).ok());  // nothing free now
  EXPECT_TRUE(Place(Spec(8, 1), nodes, false).ok());  // but it fits the cluster
  auto never = Place(Spec(16, 1), nodes, false);
  EXPECT_THAT(std::string(never.status().message()), HasSubstr("the cluster has: 8 (a:4, b:4)"));
}

TEST(Scheduler, ColocatedGroupsShareExecutors) {
  auto s = Spec(4, 2);
  auto* g = s.add_groups();
  g->set_name("rollout");
  g->set_devices(4);
  g->set_colocate_with("actor");
  ASSERT_TRUE(NormalizeAndValidateJobSpec(s).ok());
  auto p = Place(s, {Node("a", 4)}, true);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->size(), 4u);  // one executor per device hosts both groups
  for (const auto& a : *p) {
    ASSERT_EQ(a.ranks_size(), 2);
    EXPECT_EQ(a.ranks(0).rank(), a.ranks(1).rank());
  }
}

TEST(Scheduler, SeparateGroupsGetSeparateDevicesAndGangFails) {
  auto s = Spec(4, 1);
  auto* g = s.add_groups();
  g->set_name("rollout");
  g->set_devices(2);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(s).ok());
  auto p = Place(s, {Node("a", 4), Node("b", 2)}, true);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->size(), 6u);
  EXPECT_EQ(NodesOf(*p, "rollout"), (std::vector<std::string>{"b", "b"}));
  // One device short: nothing is placed (gang).
  EXPECT_FALSE(Place(s, {Node("a", 4), Node("b", 1)}, true).ok());
}

TEST(Scheduler, SkipsUnschedulableNodes) {
  auto b = Node("b", 4);
  b.schedulable = false;
  auto p = Place(Spec(4, 1), {Node("a", 2), b}, true);
  EXPECT_FALSE(p.ok());
}

}  // namespace
}  // namespace tessera::controller
