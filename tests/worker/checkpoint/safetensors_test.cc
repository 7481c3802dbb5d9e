// safetensors: round trip (F32 and BF16, metadata), and every kind of damage — truncation
// anywhere, a bad header size, broken JSON, unknown dtypes, ranges outside the file or
// overlapping, sizes that do not match the shape — is an error naming the file, never a
// crash or an out-of-bounds read (the test runs under ASan in the sanitizer build).
#include "worker/checkpoint/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "common/util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/model/config.h"
#include "common/dtype.h"

namespace tessera::checkpoint {
namespace {
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/st-", getpid(), "-", RandomHex(4), "-", name);
}

std::string Raw(const std::string& path) { return *ReadFile(path); }
void Put(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// A file whose header is `header` (padded to 8) followed by `data` bytes.
std::string Handmade(const std::string& header, size_t data) {
  std::string h = header;
  uint64_t n = h.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + h + std::string(data, '\0');
}

TEST(Safetensors, RoundTripF32Bf16AndMetadata) {
  const std::string p = TempPath("ok.safetensors");
  std::vector<float> a = {1.f, -2.5f, 3.25f, 0.f, 1e-3f, 7.f};
  std::vector<uint16_t> b = {tessera::FloatToBf16(1.5f), tessera::FloatToBf16(-0.25f)};
  ASSERT_TRUE(WriteSafetensors(p, {{"a", "F32", {2, 3}, a.data(), a.size() * 4, {}}, {"b", "BF16", {2}, b.data(), 4, {}}},
                               {{"format", "pt"}})
                  .ok());
  auto r = SafetensorsReader::Open(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->metadata().at("format"), "pt");
  EXPECT_EQ((*r)->tensors().at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*(*r)->ReadF32("a"), a);
  EXPECT_EQ(*(*r)->ReadF32("b"), (std::vector<float>{1.5f, -0.25f}));
  EXPECT_EQ((*r)->ReadF32("c").status().code(), absl::StatusCode::kNotFound);
  // The data starts 8-byte aligned, as Hugging Face's writer does.
  const std::string raw = Raw(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  // Writing refuses a size that does not match the shape, and a repeated name.
  EXPECT_FALSE(WriteSafetensors(p, {{"a", "F32", {2, 3}, a.data(), 20, {}}}).ok());
  EXPECT_FALSE(WriteSafetensors(p, {{"a", "F32", {1}, a.data(), 4, {}}, {"a", "F32", {1}, a.data(), 4, {}}}).ok());
}

// One tensor-parallel rank's slice, read alone: a block of rows, a block of columns, from
// F32, BF16 and F16 sources (16-bit sources converted exactly).
TEST(Safetensors, SlicesReadOnlyWhatARankHolds) {
  const std::string p = TempPath("slices.safetensors");
  std::vector<float> a(4 * 6);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i) - 3.f;  // exact in bf16 and f16
  std::vector<uint16_t> b(a.size()), h(a.size());
  for (size_t i = 0; i < a.size(); ++i) b[i] = tessera::FloatToBf16(a[i]), h[i] = tessera::FloatToF16(a[i]);
  ASSERT_TRUE(WriteSafetensors(p, {{"f32", "F32", {4, 6}, a.data(), a.size() * 4, {}},
                                   {"bf16", "BF16", {4, 6}, b.data(), b.size() * 2, {}},
                                   {"f16", "F16", {4, 6}, h.data(), h.size() * 2, {}}})
                  .ok());
  auto r = SafetensorsReader::Open(p);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const char* name : {"f32", "bf16", "f16"}) {
    SCOPED_TRACE(name);
    for (int dim : {0, 1})
      for (int parts : {1, 2}) {
        for (int index = 0; index < parts; ++index) {
          const auto want = model::TpShardOf(a, {4, 6}, dim, parts, index);
          std::vector<float> got(want.size());
          ASSERT_TRUE((*r)->ReadF32SliceInto(name, dim, parts, index, got.data()).ok());
          EXPECT_EQ(got, want) << "dim " << dim << " slice " << index << " of " << parts;
          if (std::string(name) == "bf16") {  // as stored: the bf16 bits of the same slice
            std::vector<uint16_t> raw(want.size());
            ASSERT_TRUE((*r)->ReadRawSliceInto(name, dim, parts, index, raw.data()).ok());
            for (size_t i = 0; i < raw.size(); ++i) EXPECT_EQ(tessera::Bf16ToFloat(raw[i]), want[i]);
            // ... and any range of its rows (dim 0: [4 / parts, 6]; dim 1: [4, 6 / parts]).
            auto rows = (*r)->SliceRows(name, dim, parts);
            ASSERT_TRUE(rows.ok()) << rows.status();
            EXPECT_EQ(rows->first, dim == 0 ? 4 / parts : 4);
            EXPECT_EQ(rows->second, dim == 0 ? 6 : 6 / parts);
            for (int64_t begin = 0; begin <= rows->first; ++begin)
              for (int64_t end = begin; end <= rows->first; ++end) {
                std::vector<uint16_t> part((end - begin) * rows->second + 1, 0xffff);
                ASSERT_TRUE((*r)->ReadRawSliceRowsInto(name, dim, parts, index, begin, end, part.data()).ok());
                for (int64_t i = 0; i < (end - begin) * rows->second; ++i)
                  EXPECT_EQ(part[i], raw[begin * rows->second + i]) << "rows [" << begin << ", " << end << ")";
                EXPECT_EQ(part.back(), 0xffff) << "wrote past rows [" << begin << ", " << end << ")";
              }
            std::vector<uint16_t> none(64);
            EXPECT_THAT(std::string((*r)->ReadRawSliceRowsInto(name, dim, parts, index, 0, rows->first + 1, none.data()).message()),
                        HasSubstr("has no rows [0, "));
          }
        }
      }
    std::vector<float> got(24);
    EXPECT_THAT(std::string((*r)->ReadF32SliceInto(name, 1, 4, 0, got.data()).message()),
                HasSubstr("has no slice 0 of 4 along dim 1"));
  }
}

TEST(Safetensors, EveryTruncationIsAnError) {
  const std::string p = TempPath("full.safetensors"), q = TempPath("cut.safetensors");
  std::vector<float> a(37, 1.f);
  ASSERT_TRUE(WriteSafetensors(p, {{"a", "F32", {37}, a.data(), a.size() * 4, {}}}).ok());
  const std::string raw = Raw(p);
  for (size_t cut = 0; cut < raw.size(); ++cut) {
    Put(q, raw.substr(0, cut));
    auto r = SafetensorsReader::Open(q);
    EXPECT_FALSE(r.ok()) << "cut at " << cut;
    if (!r.ok()) {
      EXPECT_THAT(std::string(r.status().message()), HasSubstr(q));
    }
  }
}

TEST(Safetensors, DamagedHeadersAreErrors) {
  const std::string p = TempPath("bad.safetensors");
  struct Case {
    std::string header;
    size_t data;
    const char* expect;
  } cases[] = {
      {"not json", 0, "not a JSON object"},
      {"[1, 2]", 0, "not a JSON object"},
      {R"({"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4, "unknown dtype F33"},
      {R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, "negative"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4, "4 bytes for shape [2]"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 4, "outside the 4 data bytes"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8, "outside"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       8, "overlap"},
      {R"({"a": {"dtype": "F32", "shape": [1]}})", 4, "needs dtype, shape and data_offsets"},
      {R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 4]}})", 4, "too large"},
      {R"({"__metadata__": {"k": 1}})", 0, "not a string"},
  };
  for (const auto& c : cases) {
    Put(p, Handmade(c.header, c.data));
    auto r = SafetensorsReader::Open(p);
    ASSERT_FALSE(r.ok()) << c.header;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.expect)) << c.header;
  }
  // A header size larger than the file.
  std::string big(8, '\0');
  big[0] = 100;
  Put(p, big + "{}");
  EXPECT_THAT(std::string(SafetensorsReader::Open(p).status().message()), HasSubstr("header size 100"));
  // An integer dtype cannot be read as f32.
  Put(p, Handmade(R"({"a": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})", 4));
  auto r = SafetensorsReader::Open(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(std::string((*r)->ReadF32("a").status().message()), HasSubstr("expected F32, BF16 or F16"));
}

}  // namespace
}  // namespace tessera::checkpoint
