#include "common/rpc/tensor_stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <google/protobuf/util/message_differencer.h>

namespace tessera {
namespace {

v1::NamedTensor Tensor(const std::string& name, v1::DType t, std::vector<int64_t> shape) {
  v1::NamedTensor x;
  x.set_name(name);
  x.set_dtype(t);
  int64_t n = TensorDTypeBytes(t);
  for (int64_t d : shape) x.add_shape(d), n *= d;
  for (int64_t i = 0; i < n; ++i) x.mutable_data()->push_back(static_cast<char>(i * 7 + name.size()));
  return x;
}

TEST(TensorStream, ChunksRebuildTheBatchAtAnyChunkSize) {
  v1::TensorBatch b;
  *b.add_tensors() = Tensor("prompt", v1::DTYPE_I32, {5, 3});
  *b.add_tensors() = Tensor("empty", v1::DTYPE_F32, {0, 4});
  *b.add_tensors() = Tensor("reward", v1::DTYPE_F32, {5});
  for (size_t chunk : {1, 7, 20, 60, 1 << 20}) {
    std::vector<v1::TensorChunk> chunks;
    ASSERT_TRUE(ForEachChunk(b, [&](const v1::TensorChunk& c) {
      chunks.push_back(c);
      return true;
    }, chunk));
    for (const auto& c : chunks) EXPECT_LE(c.data().size(), chunk);
    // 60 bytes of prompt in pieces, one chunk for the empty tensor, 20 bytes of reward.
    EXPECT_EQ(chunks.size(), (60 + chunk - 1) / chunk + 1 + (20 + chunk - 1) / chunk) << chunk;
    BatchAssembler a;
    for (auto& c : chunks) ASSERT_TRUE(a.Add(std::move(c)).ok());
    auto got = std::move(a).Finish();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*got, b)) << chunk;
  }
}

TEST(TensorStream, AStreamThatBreaksStopsTheChunks) {
  v1::TensorBatch b;
  *b.add_tensors() = Tensor("x", v1::DTYPE_F32, {16});
  int calls = 0;
  EXPECT_FALSE(ForEachChunk(b, [&](const v1::TensorChunk&) { return ++calls < 2; }, 8));
  EXPECT_EQ(calls, 2);
}

TEST(TensorStream, MalformedStreamsAreRefusedNamingTheTensor) {
  auto refuse = [](std::vector<v1::TensorChunk> cs, const std::string& why) {
    BatchAssembler a;
    absl::Status st;
    for (auto& c : cs)
      if (st = a.Add(std::move(c)); !st.ok()) break;
    if (st.ok()) st = std::move(a).Finish().status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr(why));
  };
  v1::TensorChunk head;
  head.set_name("x"), head.set_dtype(v1::DTYPE_F32), head.add_shape(2);
  v1::TensorChunk more;
  more.set_data(std::string(4, 'a'));
  refuse({more}, "the first chunk names no tensor");
  refuse({head}, "tensor 'x': 0 bytes; its shape and dtype hold 8");                   // too short
  refuse({head, more, more, more}, "tensor 'x': 12 bytes; its shape and dtype hold 8");  // too long
  refuse({head, more, more, head}, "tensor 'x' comes twice");
  v1::TensorChunk odd = head;
  odd.set_dtype(v1::DTYPE_UNSPECIFIED);
  refuse({odd}, "tensor 'x': unsupported dtype");
  v1::TensorChunk neg = head;
  neg.set_shape(0, -1);
  refuse({neg}, "tensor 'x': bad shape");
  v1::TensorChunk typed = more;
  typed.set_dtype(v1::DTYPE_F32);
  refuse({head, typed}, "a continuation chunk carries a dtype or shape");
}

}  // namespace
}  // namespace tessera
