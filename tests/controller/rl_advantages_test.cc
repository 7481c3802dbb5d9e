// The driver's dynamic sampling (GroupFilter: prompt groups whose rewards are all equal
// set aside, the batch filled with groups that carry a signal in the order generated,
// then with set-aside ones where the generations fall short), BatchTokens and PPO's
// advantages of multi-turn samples, on hand-made samples batches.
#include "controller/driver/rl_advantages.h"

#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/rpc/tensor_stream.h"

namespace tessera::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::NamedTensor I32(const std::string& name, std::vector<int64_t> shape, const std::vector<int32_t>& v) {
  v1::NamedTensor t;
  t.set_name(name), t.set_dtype(v1::DTYPE_I32);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t)));
  return t;
}

// Rows tagged by `tag` (prompt [N, 2] = {tag + row, -1}), their rewards, lengths 3 and 5.
v1::TensorBatch Samples(int32_t tag, const std::vector<float>& rewards) {
  const int64_t n = static_cast<int64_t>(rewards.size());
  std::vector<int32_t> prompt, plen(n, 3), clen(n, 5);
  for (int64_t i = 0; i < n; ++i) prompt.push_back(tag + static_cast<int32_t>(i)), prompt.push_back(-1);
  v1::TensorBatch b;
  *b.add_tensors() = I32("prompt", {n, 2}, prompt);
  *b.add_tensors() = I32("prompt_len", {n}, plen);
  *b.add_tensors() = I32("completion_len", {n}, clen);
  *b.add_tensors() = F32Tensor("reward", {n}, rewards);
  return b;
}

std::vector<int32_t> Tags(const v1::TensorBatch& b) {
  for (const auto& t : b.tensors())
    if (t.name() == "prompt") {
      std::vector<int32_t> v(t.data().size() / sizeof(int32_t)), tags;
      std::memcpy(v.data(), t.data().data(), t.data().size());
      for (size_t i = 0; i < v.size(); i += 2) tags.push_back(v[i]);
      return tags;
    }
  return {};
}

TEST(GroupFilter, KeepsGroupsWithASignalInOrderAndFillsWhenShort) {
  // Groups of 2: generation 1 = {1, 0} {1, 1} {0, 0.5}; generation 2 = {0, 0} {1, 0.5} {1, 1}.
  GroupFilter f(3, 2);
  ASSERT_TRUE(f.Add(Samples(100, {1, 0, 1, 1, 0, 0.5})).ok());
  EXPECT_FALSE(f.full());
  EXPECT_EQ(f.kept(), 2);
  EXPECT_EQ(f.dropped(), 1);
  ASSERT_TRUE(f.Add(Samples(200, {0, 0, 1, 0.5, 1, 1})).ok());
  EXPECT_TRUE(f.full());
  EXPECT_EQ(f.dropped(), 3);
  auto b = f.Take();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(Tags(*b), ElementsAre(100, 101, 104, 105, 202, 203));
  EXPECT_EQ(f.filled(), 0);
  for (const auto& t : b->tensors()) EXPECT_EQ(t.shape(0), 6) << t.name();
  auto tokens = BatchTokens(*b);
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(*tokens, 6 * (3 + 5));

  // Four groups wanted of one generation: the set-aside group fills the batch.
  GroupFilter short_of(4, 2);
  ASSERT_TRUE(short_of.Add(Samples(100, {1, 0, 1, 1, 0, 0.5, 2, 2})).ok());
  auto filled = short_of.Take();
  ASSERT_TRUE(filled.ok()) << filled.status();
  EXPECT_THAT(Tags(*filled), ElementsAre(100, 101, 104, 105, 102, 103, 106, 107));
  EXPECT_EQ(short_of.filled(), 2);

  // Too few groups at all, and rows that are not whole groups, are refused by name.
  GroupFilter few(4, 2);
  ASSERT_TRUE(few.Add(Samples(0, {1, 0})).ok());
  EXPECT_THAT(std::string(few.Take().status().message()), HasSubstr("1 groups generated, 4 needed"));
  EXPECT_THAT(std::string(GroupFilter(2, 2).Add(Samples(0, {1, 0, 1})).message()), HasSubstr("3 rows are not whole groups of 2"));
  v1::TensorBatch no_reward = Samples(0, {1, 0});
  no_reward.mutable_tensors()->RemoveLast();
  EXPECT_THAT(std::string(GroupFilter(1, 2).Add(no_reward).message()), HasSubstr("no tensor 'reward'"));
}

// PPO's advantages of a multi-turn batch: a row of 5 tokens of which 2 are an observation
// (completion_mask 0) is a response of its 3 sampled tokens — the same advantages and
// returns as a single-turn row of those 3 tokens with the same values.
TEST(PpoAdvantages, AMultiTurnResponseIsItsSampledTokens) {
  v1::RlSpec rl;
  rl.set_gamma(1.0), rl.set_gae_lambda(0.95);
  auto batch = [](bool multi) {
    v1::TensorBatch b;
    const int32_t len = multi ? 5 : 3;
    *b.add_tensors() = I32("completion_len", {2}, {len, len});
    *b.add_tensors() = F32Tensor("reward", {2}, {1.0f, 0.0f});
    *b.add_tensors() = F32Tensor("old_value", {2, 5}, {0.1f, 0.2f, 0.3f, 0, 0, 0.4f, 0.5f, 0.6f, 0, 0});
    if (multi) *b.add_tensors() = I32("completion_mask", {2, 5}, {1, 0, 0, 1, 1, 1, 1, 0, 0, 1});
    return b;
  };
  v1::TensorBatch multi = batch(true), single = batch(false);
  double kl = 0;
  ASSERT_TRUE(AddPpoAdvantages(rl, 1, &multi, &kl).ok());
  ASSERT_TRUE(AddPpoAdvantages(rl, 1, &single, &kl).ok());
  for (const char* name : {"advantage", "returns"}) {
    const v1::NamedTensor *a = nullptr, *b = nullptr;
    for (const auto& t : multi.tensors()) if (t.name() == name) a = &t;
    for (const auto& t : single.tensors()) if (t.name() == name) b = &t;
    ASSERT_TRUE(a != nullptr && b != nullptr) << name;
    EXPECT_EQ(a->data(), b->data()) << name;
    std::vector<float> v(10);
    std::memcpy(v.data(), a->data().data(), 10 * sizeof(float));
    EXPECT_NE(v[2], 0.0f) << name << ": the third sampled token has a value";
    EXPECT_EQ(v[3], 0.0f) << name << ": past the row's three sampled tokens";
  }
}

}  // namespace
}  // namespace tessera::controller
