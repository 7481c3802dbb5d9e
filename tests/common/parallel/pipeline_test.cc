// Pipeline schedules: GPipe, 1F1B and Megatron's interleaved 1F1B (common/parallel/pipeline.h).
#include "common/parallel/pipeline.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::parallel {
namespace {
using ::testing::HasSubstr;

// Every schedule runs each (chunk, micro-batch) forward once and backward once, the
// backward after the forward; 1F1B holds at most pp - rank forwards in flight (vpp 1);
// the interleaved warm-up follows Megatron's formula.
TEST(PipelineSchedule, ShapesAndBounds) {
  for (Schedule sched : {Schedule::kOneFOneB, Schedule::kGPipe})
    for (auto [pp, vpp, m] : {std::tuple{2, 1, 4}, std::tuple{4, 1, 8}, std::tuple{4, 2, 8}, std::tuple{2, 3, 4}})
      for (int r = 0; r < pp; ++r) {
        SCOPED_TRACE(::testing::Message() << "pp " << pp << " vpp " << vpp << " m " << m << " rank " << r);
        auto ops = PipelineSchedule(sched, pp, vpp, r, m);
        ASSERT_TRUE(ops.ok()) << ops.status();
        std::map<std::pair<int, int64_t>, int> state;  // 1 after the forward, 2 after the backward
        int in_flight = 0, most = 0;
        for (const PipeOp& op : *ops) {
          auto& st = state[{op.chunk, op.micro_batch}];
          EXPECT_EQ(st, op.forward ? 0 : 1);
          st = op.forward ? 1 : 2;
          in_flight += op.forward ? 1 : -1;
          most = std::max(most, in_flight);
        }
        EXPECT_EQ(state.size(), size_t(vpp * m));
        for (auto& [k, st] : state) EXPECT_EQ(st, 2);
        int expect = vpp * m;  // GPipe: everything in flight
        if (sched == Schedule::kOneFOneB) expect = vpp == 1 ? std::min(pp - r, m) : std::min((pp - r - 1) * 2 + (vpp - 1) * pp + 1, vpp * m);
        EXPECT_EQ(most, expect);
      }
  EXPECT_THAT(std::string(PipelineSchedule(Schedule::kOneFOneB, 4, 2, 0, 6).status().message()),
              HasSubstr("multiple of pp"));
  EXPECT_FALSE(ParseSchedule("zigzag").ok());
  EXPECT_EQ(*ParseSchedule("gpipe"), Schedule::kGPipe);
}

}  // namespace
}  // namespace tessera::parallel
