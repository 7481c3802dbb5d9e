#include "common/parallel/layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::parallel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using G = std::vector<std::vector<int>>;

TEST(Layout, CoordsRoundTrip) {
  Layout l{2, 2, 2, 2};
  for (int r = 0; r < l.world(); ++r) EXPECT_EQ(RankOf(l, CoordsOf(l, r)), r);
  Coords c = CoordsOf(l, 13);  // 13 = 1 + 2*(0 + 2*(1 + 2*1))
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
}

// Worked by hand: rank = tp_r + 2*(cp_r + 2*(dp_r + 2*pp_r)).
TEST(Layout, Tp2Cp2Dp2Pp2Groups) {
  Layout l{2, 2, 2, 2};
  EXPECT_EQ(BuildGroups(l, GroupKind::kTp),
            (G{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kCp),
            (G{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kDp),
            (G{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kPp),
            (G{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kDpCp),
            (G{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kMp),
            (G{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kEmbedding), BuildGroups(l, GroupKind::kPp));
  EXPECT_EQ(BuildGroups(l, GroupKind::kWorld).size(), 1u);
  EXPECT_EQ(BuildGroups(l, GroupKind::kWorld)[0].size(), 16u);
}

// Megatron's documented example: 16 GPUs, tp=2, pp=4 (dp=2).
TEST(Layout, MegatronExampleTp2Pp4) {
  Layout l{2, 1, 2, 4};
  EXPECT_EQ(BuildGroups(l, GroupKind::kTp)[1], (std::vector<int>{2, 3}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kPp),
            (G{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kDp),
            (G{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kEmbedding), (G{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
  // Middle stages are in no embedding group.
  EXPECT_TRUE(GroupOf(l, GroupKind::kEmbedding, 5).ranks.empty());
  auto m = GroupOf(l, GroupKind::kEmbedding, 13);
  EXPECT_EQ(m.ranks, (std::vector<int>{1, 13}));
  EXPECT_EQ(m.index, 1);
  EXPECT_EQ(m.rank_in_group, 1);
}

TEST(Layout, Tp2Dp2Pp2) {
  Layout l{2, 1, 2, 2};
  EXPECT_EQ(BuildGroups(l, GroupKind::kTp), (G{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kDp), (G{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kPp), (G{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kCp), (G{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(BuildGroups(l, GroupKind::kDpCp), BuildGroups(l, GroupKind::kDp));
  EXPECT_EQ(BuildGroups(l, GroupKind::kMp), (G{{0, 1, 4, 5}, {2, 3, 6, 7}}));
}

TEST(Layout, GroupsPartitionWorld) {
  for (Layout l : {Layout{1, 1, 1, 1}, Layout{4, 1, 2, 1}, Layout{2, 2, 1, 3}, Layout{1, 3, 2, 2}}) {
    for (GroupKind k : kAllGroupKinds) {
      if (k == GroupKind::kEmbedding) continue;
      std::vector<int> seen(l.world(), 0);
      for (const auto& g : BuildGroups(l, k))
        for (int r : g) seen[r]++;
      for (int r = 0; r < l.world(); ++r) EXPECT_EQ(seen[r], 1) << l.ToString() << " " << GroupKindName(k);
    }
  }
}

// MindSpeed-RL's example: 16 layers, pp=4, vpp=2 -> device 0 holds layers 1-2 and 9-10 (1-based).
TEST(Layout, InterleavedLayerAssignment) {
  Layout l{1, 1, 1, 4, 2};
  EXPECT_THAT(LayersOfRank(l, 16, 0), ElementsAre(std::pair{0, 2}, std::pair{8, 10}));
  EXPECT_THAT(LayersOfRank(l, 16, 3), ElementsAre(std::pair{6, 8}, std::pair{14, 16}));
}

absl::Status V(Layout l, int world, ModelShape m = {}) { return ValidateLayout(l, world, m); }

TEST(LayoutValidation, EachRuleNamesTheNumbers) {
  EXPECT_TRUE(V({2, 1, 2, 2}, 8).ok());
  auto st = V({2, 1, 2, 2}, 6);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("6 devices but tp*cp*dp*pp = 2*1*2*2 = 8"));
  EXPECT_THAT(V({1, 1, 1, 1, 2}, 1).message(), HasSubstr("vpp=2 (virtual pipeline stages) requires pp >= 2, got pp=1"));
  EXPECT_THAT(V({1, 1, 2, 1, 1, true}, 2).message(), HasSubstr("sp (sequence parallel) requires tp > 1, got tp=1"));
  EXPECT_THAT(V({1, 1, 1, 1, 1, false, 4}, 1).message(), HasSubstr("zero must be 0, 1, 2 or 3, got 4"));
  EXPECT_THAT(V({1, 1, 1, 3}, 3, {.num_layers = 16}).message(),
              HasSubstr("num_layers=16 is not divisible by pp*vpp = 3*1 = 3"));
  EXPECT_THAT(V({1, 1, 1, 2, 3}, 2, {.num_layers = 16}).message(), HasSubstr("pp*vpp = 2*3 = 6"));
  EXPECT_THAT(V({1, 1, 4, 1}, 4, {.global_batch = 30, .micro_batch = 2}).message(),
              HasSubstr("global_batch=30 is not divisible by dp*micro_batch = 4*2 = 8"));
  EXPECT_THAT(V({4, 1, 1, 1}, 4, {.num_heads = 6}).message(), HasSubstr("num_heads=6 is not divisible by tp=4"));
  EXPECT_THAT(V({4, 1, 1, 1}, 4, {.num_heads = 8, .num_kv_heads = 3}).message(),
              HasSubstr("num_kv_heads=3 must be divisible by tp=4"));
  EXPECT_TRUE(V({4, 1, 1, 1}, 4, {.num_heads = 8, .num_kv_heads = 2}).ok());  // replicated KV heads
  EXPECT_THAT(V({4, 1, 1, 1, 1, true}, 4, {.seq_len = 6}).message(),
              HasSubstr("seq_len=6 is not divisible by tp=4 (required by sequence parallelism)"));
  EXPECT_THAT(V({1, 2, 1, 1}, 2, {.seq_len = 6}).message(), HasSubstr("seq_len=6 is not divisible by 2*cp = 4"));
  EXPECT_TRUE(V({1, 2, 1, 1}, 2, {.seq_len = 8}).ok());
  EXPECT_THAT(V({0, 1, 1, 1}, 0).message(), HasSubstr("must each be >= 1"));
}

}  // namespace
}  // namespace tessera::parallel

namespace tessera::parallel {
namespace {
// Stage balance: the last virtual stage's layers as given, the rest spread with the
// first stages taking the remainder; ValidateLayout names what does not fit.
TEST(Layout, UnevenPipelineSplit) {
  auto all = [](int64_t layers, int stages, int64_t last) {
    std::vector<std::pair<int64_t, int64_t>> v;
    for (int s = 0; s < stages; ++s) v.push_back(VirtualStageLayers(layers, stages, last, {}, s));
    return v;
  };
  using P = std::pair<int64_t, int64_t>;
  EXPECT_THAT(all(16, 4, 0), ::testing::ElementsAre(P{0, 4}, P{4, 8}, P{8, 12}, P{12, 16}));
  EXPECT_THAT(all(16, 4, 1), ::testing::ElementsAre(P{0, 5}, P{5, 10}, P{10, 15}, P{15, 16}));
  EXPECT_THAT(all(16, 8, 1), ::testing::ElementsAre(P{0, 3}, P{3, 5}, P{5, 7}, P{7, 9}, P{9, 11}, P{11, 13}, P{13, 15},
                                                    P{15, 16}));
  Layout l{1, 1, 1, 4, 2};
  l.last_stage_layers = 1;
  EXPECT_THAT(LayersOfRank(l, 16, 3), ::testing::ElementsAre(std::pair{7, 9}, std::pair{15, 16}));
  EXPECT_TRUE(ValidateLayout(l, 4, {16}).ok());
  EXPECT_TRUE(ValidateLayout(l, 4, {15}).ok());  // uneven totals are fine with a last-stage count
  l.last_stage_layers = 10;
  EXPECT_THAT(std::string(ValidateLayout(l, 4, {16}).message()),
              ::testing::HasSubstr("last_stage_layers=10 leaves 6 of model.num_layers=16 for the other 7 virtual stages"));
  Layout flat{2, 1, 2, 1};
  flat.last_stage_layers = 1;
  EXPECT_THAT(std::string(ValidateLayout(flat, 4, {16}).message()), ::testing::HasSubstr("needs a pipeline (pp >= 2)"));
  Layout even{1, 1, 1, 4, 1};
  EXPECT_THAT(std::string(ValidateLayout(even, 4, {15}).message()),
              ::testing::HasSubstr("(or set layout.last_stage_layers for an uneven split)"));
}

// Every virtual stage's layers given (Megatron's --pipeline-model-parallel-layout): a
// stage may hold none (the last then runs only the head and the loss).
TEST(Layout, ExplicitStageLayers) {
  const std::vector<int> counts{3, 2, 2, 1, 2, 3, 3, 0};
  std::vector<std::pair<int64_t, int64_t>> v;
  for (int s = 0; s < 8; ++s) v.push_back(VirtualStageLayers(16, 8, 0, counts, s));
  using P = std::pair<int64_t, int64_t>;
  EXPECT_THAT(v, ::testing::ElementsAre(P{0, 3}, P{3, 5}, P{5, 7}, P{7, 8}, P{8, 10}, P{10, 13}, P{13, 16}, P{16, 16}));
  Layout l{1, 1, 1, 4, 2};
  l.stage_layers = counts;
  EXPECT_THAT(LayersOfRank(l, 16, 3), ::testing::ElementsAre(std::pair{7, 8}, std::pair{16, 16}));
  EXPECT_THAT(LayersOfRank(l, 16, 0), ::testing::ElementsAre(std::pair{0, 3}, std::pair{8, 10}));
  EXPECT_TRUE(ValidateLayout(l, 4, {16}).ok());
  EXPECT_THAT(l.ToString(), ::testing::HasSubstr("stage_layers=[3,2,2,1,2,3,3,0]"));
  auto message = [](const Layout& x, int layers) { return std::string(ValidateLayout(x, x.world(), {layers}).message()); };
  EXPECT_THAT(message(l, 15), ::testing::HasSubstr("stage_layers [3, 2, 2, 1, 2, 3, 3, 0] sum to 16 layers; model.num_layers=15"));
  Layout shorter = l;
  shorter.stage_layers.pop_back();
  EXPECT_THAT(message(shorter, 16), ::testing::HasSubstr("stage_layers has 7 entries; expected one per virtual stage, pp*vpp = 4*2 = 8"));
  Layout negative = l;
  negative.stage_layers[1] = -1, negative.stage_layers[0] = 6;
  EXPECT_THAT(message(negative, 16), ::testing::HasSubstr("stage_layers[1] = -1; must be >= 0"));
  Layout both = l;
  both.last_stage_layers = 1;
  EXPECT_THAT(message(both, 16), ::testing::HasSubstr("set stage_layers or last_stage_layers, not both"));
  Layout flat{2, 1, 2, 1};
  flat.stage_layers = {16};
  EXPECT_THAT(message(flat, 16), ::testing::HasSubstr("stage_layers needs a pipeline (pp >= 2)"));
}
}  // namespace
}  // namespace tessera::parallel
