// Hugging Face directories: export then import gives identical weights (F32) or the
// bf16-rounded ones (BF16), for a Llama (GQA, untied) and a Qwen2-style model (QKV bias,
// tied embeddings); sharded directories (model.safetensors.index.json) import; config.json
// is read with Hugging Face's keys and unsupported features are refused naming the key.
// (Our logits against transformers' on the same weights: bench/hf_logits_check.py on a
// GPU host, where transformers is installed.)
#include "worker/checkpoint/hf.h"

#include <unistd.h>

#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include <nlohmann/json.hpp>
#include "common/util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/mem_store.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/checkpoint/safetensors.h"
#include "common/dtype.h"

namespace tessera::checkpoint {
namespace {
using ::testing::HasSubstr;
using model::ReadHfConfig;

bool FileExists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

std::string TempDir() { return absl::StrCat(::testing::TempDir(), "/hf-", getpid(), "-", RandomHex(4)); }

std::unique_ptr<model::Llama> Make(const model::LlamaConfig& c, runtime::Backend* b, uint64_t seed) {
  auto m = model::Llama::Create(c, b);
  EXPECT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->InitRandom(seed, 0.5f).ok());
  return std::move(*m);
}

TEST(Hf, ExportImportRoundTrip) {
  auto be = runtime::MakeCpuBackend();
  for (bool qwen : {false, true}) {
    SCOPED_TRACE(qwen ? "qwen2 (bias, tied)" : "llama (untied)");
    auto c = model::test::TinyConfig(300, /*tied=*/qwen, /*bias=*/qwen);
    c.rope_base = 500000.f, c.norm_eps = 1e-6f;
    auto a = Make(c, be.get(), 3);
    for (const char* dtype : {"F32", "BF16"}) {
      const std::string dir = TempDir();
      ASSERT_TRUE(ExportHf(dir, *a, dtype, true).ok());
      auto read = ReadHfConfig(dir);
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(read->vocab, c.vocab);
      EXPECT_EQ(read->hidden, c.hidden);
      EXPECT_EQ(read->kv_heads, c.kv_heads);
      EXPECT_EQ(read->HeadDim(), c.HeadDim());
      EXPECT_EQ(read->tie_embeddings, c.tie_embeddings);
      EXPECT_EQ(read->qkv_bias, c.qkv_bias);
      EXPECT_EQ(read->rope_base, c.rope_base);
      EXPECT_EQ(read->norm_eps, c.norm_eps);
      auto b = Make(*read, be.get(), 99);  // other weights until imported
      ASSERT_TRUE(ImportHf(dir, *b).ok());
      for (auto& p : a->params()) {
        auto want = *a->GatherGlobal(p, false);
        if (std::string(dtype) == "BF16")
          for (float& x : want) x = tessera::Bf16ToFloat(tessera::FloatToBf16(x));
        EXPECT_EQ(*b->GatherGlobal(*b->Find(p.name()), false), want) << dtype << " " << p.name();
      }
    }
  }
}

// A critic (value head) exports as LlamaForTokenClassification with one label and reads
// back as a critic with the same weights; a critic imports a causal LM's directory, taking
// its weights and keeping its own value head; a causal LM refuses a critic's directory
// (no lm_head.weight there).
TEST(Hf, CriticRoundTripAndStartFromACausalLm) {
  auto be = runtime::MakeCpuBackend();
  auto c = model::test::TinyConfig(300, /*tied=*/false, /*bias=*/false);
  c.value_head = true;
  auto critic = Make(c, be.get(), 5);
  const std::string dir = TempDir();
  ASSERT_TRUE(ExportHf(dir, *critic, "F32", true).ok());
  std::ifstream cfg(dir + "/config.json");
  const std::string text((std::istreambuf_iterator<char>(cfg)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("LlamaForTokenClassification"));
  auto read = ReadHfConfig(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->value_head);
  auto back = Make(*read, be.get(), 77);
  ASSERT_TRUE(ImportHf(dir, *back).ok());
  for (auto& p : critic->params())
    EXPECT_EQ(*back->GatherGlobal(*back->Find(p.name()), false), *critic->GatherGlobal(p, false)) << p.name();
  // From a causal LM: its weights, the critic's own head.
  auto lmc = c;
  lmc.value_head = false;
  auto lm = Make(lmc, be.get(), 8);
  const std::string lm_dir = TempDir();
  ASSERT_TRUE(ExportHf(lm_dir, *lm, "F32", true).ok());
  auto fresh = Make(c, be.get(), 9);
  const auto head = *fresh->GatherGlobal(*fresh->Find("score.weight"), false);
  ASSERT_TRUE(ImportHf(lm_dir, *fresh).ok());
  EXPECT_EQ(*fresh->GatherGlobal(*fresh->Find("score.weight"), false), head);
  EXPECT_EQ(*fresh->GatherGlobal(*fresh->Find("model.layers.0.mlp.up_proj.weight"), false),
            *lm->GatherGlobal(*lm->Find("model.layers.0.mlp.up_proj.weight"), false));
  EXPECT_THAT(std::string(ImportHf(dir, *lm).message()), HasSubstr("lm_head.weight"));
}

// A reward model (sequence_score) exports as LlamaForSequenceClassification and reads back
// as one with the same weights, its score head included; a causal LM's directory has no
// score to give it (import refuses, naming score.weight), unlike a critic's start.
TEST(Hf, RewardModelRoundTripNeedsItsScoreHead) {
  auto be = runtime::MakeCpuBackend();
  auto c = model::test::TinyConfig(300, /*tied=*/false, /*bias=*/false);
  c.value_head = c.sequence_score = true;
  auto rm = Make(c, be.get(), 5);
  const std::string dir = TempDir();
  ASSERT_TRUE(ExportHf(dir, *rm, "F32", true).ok());
  auto read = ReadHfConfig(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->value_head && read->sequence_score);
  std::ifstream cfg(dir + "/config.json");
  const std::string text((std::istreambuf_iterator<char>(cfg)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("LlamaForSequenceClassification"));
  auto back = Make(*read, be.get(), 77);
  ASSERT_TRUE(ImportHf(dir, *back).ok());
  for (auto& p : rm->params())
    EXPECT_EQ(*back->GatherGlobal(*back->Find(p.name()), false), *rm->GatherGlobal(p, false)) << p.name();
  auto lmc = c;
  lmc.value_head = lmc.sequence_score = false;
  auto lm = Make(lmc, be.get(), 8);
  const std::string lm_dir = TempDir();
  ASSERT_TRUE(ExportHf(lm_dir, *lm, "F32", true).ok());
  EXPECT_THAT(std::string(ImportHf(lm_dir, *back).message()), HasSubstr("score.weight"));
}

// A pipeline exports the same directory as one rank: pp2 and pp4 (Gloo threads), tied
// and untied; the stages send what they hold to stage 0, which writes.
TEST(Hf, PipelineExportEqualsOneRank) {
  auto be = runtime::MakeCpuBackend();
  for (auto [pp, tied] : {std::pair{2, false}, std::pair{2, true}, std::pair{4, true}}) {
    SCOPED_TRACE(::testing::Message() << "pp" << pp << (tied ? " tied" : ""));
    auto c = model::test::TinyConfig(300, tied, /*bias=*/true);
    c.layers = 4;
    auto one = Make(c, be.get(), 3);
    const std::string want = TempDir(), got = TempDir();
    ASSERT_TRUE(ExportHf(want, *one, "F32", true).ok());
    testing::MemStore store;
    const std::string key = RandomHex(4);
    std::vector<std::thread> threads;
    for (int r = 0; r < pp; ++r)
      threads.emplace_back([&, r] {
        auto rb = runtime::MakeCpuBackend();
        auto comm = comm::MakeGlooCommunicator("pp", key, r, pp, &store, {"127.0.0.1", 60000});
        ASSERT_TRUE(comm.ok()) << comm.status();
        auto m = model::Llama::Create(c, rb.get(), nullptr, false, nullptr, model::StageSpec{pp, r, 1});
        ASSERT_TRUE(m.ok()) << m.status();
        ASSERT_TRUE((*m)->InitRandom(3, 0.5f).ok());
        EXPECT_TRUE(ExportHf(got, **m, "F32", true, comm->get()).ok());
      });
    for (auto& t : threads) t.join();
    auto a = Make(c, be.get(), 90), b = Make(c, be.get(), 91);
    ASSERT_TRUE(ImportHf(want, *a).ok());
    ASSERT_TRUE(ImportHf(got, *b).ok());
    for (auto& p : a->params())
      EXPECT_EQ(*b->GatherGlobal(*b->Find(p.name()), false), *a->GatherGlobal(p, false)) << p.name();
  }
}

// Above max_shard_bytes the export writes consecutive tensors into
// model-0000k-of-0000n.safetensors files with an index (weight_map, total_size), as
// save_pretrained does; TP ranks import it reading only their slices; exporting again
// into the same directory as one file leaves no stale index; a failed write (rank 0's
// directory is a file, or its second file's name a directory) is an error there, leaves
// no weight file, and the other rank returns from the gathers.
TEST(Hf, ShardedExportIndexAndTpImport) {
  auto be = runtime::MakeCpuBackend();
  auto c = model::test::TinyConfig(300, /*tied=*/false, /*bias=*/true);
  auto a = Make(c, be.get(), 3);
  const std::string dir = TempDir();
  ASSERT_TRUE(ExportHf(dir, *a, "F32", true, nullptr, /*max_shard_bytes=*/8000).ok());
  const nlohmann::json index = nlohmann::json::parse(*ReadFile(dir + "/model.safetensors.index.json"));
  std::set<std::string> files;
  int64_t total = 0;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  for (const std::string& f : files) {
    auto r = SafetensorsReader::Open(dir + "/" + f);
    ASSERT_TRUE(r.ok()) << r.status();
    int64_t bytes = 0;
    for (const auto& [name, info] : (*r)->tensors()) {
      bytes += static_cast<int64_t>(info.end - info.begin);
      EXPECT_EQ(index["weight_map"][name], f) << name;
    }
    // The largest tensor (the 300 x 16 embedding, 19,200 B) has a file of its own.
    EXPECT_TRUE(bytes <= 8000 || (*r)->tensors().size() == 1) << f << " holds " << bytes << " B";
    total += bytes;
  }
  EXPECT_GT(files.size(), 3u);
  EXPECT_EQ(*files.begin(), absl::StrFormat("model-00001-of-%05d.safetensors", files.size()));
  EXPECT_EQ(index["weight_map"].size(), a->params().size());
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_FALSE(FileExists(dir + "/model.safetensors"));
  // Two TP ranks (Gloo threads) import it: each reads its slices; gathered, the weights are a's.
  testing::MemStore store;
  std::vector<std::thread> threads;
  const std::string blocked = dir + "/config.json";  // a file: no directory can be made there
  const std::string broken = dir + "-broken";
  for (int n = 2; n <= 40; ++n) ASSERT_TRUE(MakeDirs(absl::StrFormat("%s/model-00002-of-%05d.safetensors", broken, n)).ok());
  absl::Status failed_write, failed_mid;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto tp = comm::MakeGlooCommunicator("tp", "hf-sharded", r, 2, &store, {"127.0.0.1", 60000});
      ASSERT_TRUE(tp.ok()) << tp.status();
      auto m = model::Llama::Create(c, be.get(), tp->get());
      ASSERT_TRUE(m.ok());
      ASSERT_TRUE(ImportHf(dir, **m).ok());
      for (auto& p : a->params()) EXPECT_EQ(*(*m)->GatherGlobal(*(*m)->Find(p.name()), false), *a->GatherGlobal(p, false)) << p.name();
      const absl::Status st = ExportHf(blocked + "/x", **m, "BF16", r == 0, nullptr, 8000);
      if (r == 0) failed_write = st;
      else EXPECT_TRUE(st.ok()) << st;
      // A write that fails at the second file (a directory has its name): the first goes too.
      const absl::Status mid = ExportHf(broken, **m, "BF16", r == 0, nullptr, 8000);
      if (r == 0) failed_mid = mid;
      else EXPECT_TRUE(mid.ok()) << mid;
    });
  for (auto& t : threads) t.join();
  EXPECT_FALSE(failed_write.ok());
  EXPECT_THAT(std::string(failed_mid.message()), HasSubstr("model-00002-of-"));
  for (int n = 2; n <= 40; ++n) {
    EXPECT_FALSE(FileExists(absl::StrFormat("%s/model-00001-of-%05d.safetensors", broken, n))) << n;
    EXPECT_FALSE(FileExists(absl::StrFormat("%s/model-00003-of-%05d.safetensors", broken, n))) << n;
  }
  EXPECT_FALSE(FileExists(broken + "/model.safetensors.index.json"));
  // One file again: the shards and the index of the first export are gone.
  ASSERT_TRUE(ExportHf(dir, *a, "F32", true).ok());
  EXPECT_TRUE(FileExists(dir + "/model.safetensors"));
  EXPECT_FALSE(FileExists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(FileExists(dir + "/" + *files.begin()));
  auto b = Make(c, be.get(), 99);
  ASSERT_TRUE(ImportHf(dir, *b).ok());
  for (auto& p : a->params()) EXPECT_EQ(*b->GatherGlobal(*b->Find(p.name()), false), *a->GatherGlobal(p, false));
}

// Two TP ranks import F32, BF16 and F16 files (the same weights, rounded to each) whole
// and in pieces of a few rows (a piece never splits a row: 64-byte pieces of 64-byte f32
// rows, of 128-byte bf16 rows): every rank's slices — blocks of rows and of columns —
// equal the source's values.
TEST(Hf, TpImportInPiecesFromEachSourceDtype) {
  auto be = runtime::MakeCpuBackend();
  auto c = model::test::TinyConfig(300, /*tied=*/false, /*bias=*/true);
  auto a = Make(c, be.get(), 5);
  const std::string dir = TempDir();
  ASSERT_TRUE(ExportHf(dir, *a, "F32", true).ok());
  auto f32 = SafetensorsReader::Open(dir + "/model.safetensors");
  ASSERT_TRUE(f32.ok()) << f32.status();
  for (const char* dtype : {"F32", "BF16", "F16"}) {
    SCOPED_TRACE(dtype);
    const std::string src = absl::StrCat(dir, "-", dtype);
    std::map<std::string, std::vector<float>> want;  // the values as the file holds them
    std::vector<std::vector<uint16_t>> low;
    std::vector<TensorToWrite> tensors;
    for (const auto& [name, info] : (*f32)->tensors()) {
      std::vector<float> v = *(*f32)->ReadF32(name);
      const std::string d = dtype;
      if (d == "F32") {
        want[name] = v;
        tensors.push_back({name, d, info.shape, want[name].data(), v.size() * 4, {}});
        continue;
      }
      low.emplace_back(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        low.back()[i] = d == "BF16" ? tessera::FloatToBf16(v[i]) : tessera::FloatToF16(v[i]);
        v[i] = d == "BF16" ? tessera::Bf16ToFloat(low.back()[i]) : tessera::F16ToFloat(low.back()[i]);
      }
      want[name] = v;
      tensors.push_back({name, d, info.shape, low.back().data(), v.size() * 2, {}});
    }
    ASSERT_TRUE(MakeDirs(src).ok());
    ASSERT_TRUE(WriteFileAtomic(src + "/config.json", *ReadFile(dir + "/config.json")).ok());
    ASSERT_TRUE(WriteSafetensors(src + "/model.safetensors", tensors).ok());
    for (int64_t piece : {kDefaultImportPieceBytes, int64_t{64}}) {
      SCOPED_TRACE(piece);
      testing::MemStore store;
      std::vector<std::thread> threads;
      for (int r = 0; r < 2; ++r)
        threads.emplace_back([&, r] {
          auto tp = comm::MakeGlooCommunicator("tp", "hf-pieces", r, 2, &store, {"127.0.0.1", 60000});
          ASSERT_TRUE(tp.ok()) << tp.status();
          auto m = model::Llama::Create(c, be.get(), tp->get());
          ASSERT_TRUE(m.ok());
          const absl::Status imported = ImportHf(src, **m, piece);
          ASSERT_TRUE(imported.ok()) << imported;
          for (auto& p : (*m)->params()) {
            const model::TpSplit split = (*m)->SplitOf(p);
            const auto slice = model::TpShardOf(want[p.name()], p.spec.shape, split.dim, split.parts, split.index);
            std::vector<float> held(p.value.numel());
            ASSERT_TRUE(be->CopyToHost(p.value, held.data()).ok());
            EXPECT_EQ(held, slice) << p.name() << " on rank " << r;
          }
        });
      for (auto& t : threads) t.join();
    }
  }
  auto m = model::Llama::Create(c, be.get());
  ASSERT_TRUE(m.ok());
  EXPECT_THAT(std::string(ImportHf(dir, **m, 0).message()), HasSubstr("piece_bytes must be > 0"));
}

TEST(Hf, ShardedDirectoryAndErrors) {
  auto be = runtime::MakeCpuBackend();
  auto c = model::test::TinyConfig(300, false, false);
  auto a = Make(c, be.get(), 3);
  const std::string one = TempDir(), two = TempDir();
  ASSERT_TRUE(ExportHf(one, *a, "F32", true).ok());
  // Split into two files with an index, as large Hugging Face checkpoints are.
  auto r = SafetensorsReader::Open(one + "/model.safetensors");
  ASSERT_TRUE(r.ok());
  std::vector<std::vector<float>> data;
  std::vector<TensorToWrite> first, second;
  std::string map;
  data.reserve((*r)->tensors().size());
  for (const auto& [name, info] : (*r)->tensors()) {
    data.push_back(*(*r)->ReadF32(name));
    const bool in_first = name.find("layers.1.") == std::string::npos;
    (in_first ? first : second).push_back({name, "F32", info.shape, data.back().data(), data.back().size() * 4, {}});
    absl::StrAppend(&map, map.empty() ? "" : ", ", "\"", name, "\": \"model-0000", in_first ? 1 : 2, "-of-00002.safetensors\"");
  }
  ASSERT_TRUE(MakeDirs(two).ok());
  ASSERT_TRUE(WriteSafetensors(two + "/model-00001-of-00002.safetensors", first).ok());
  ASSERT_TRUE(WriteSafetensors(two + "/model-00002-of-00002.safetensors", second).ok());
  std::ofstream(two + "/model.safetensors.index.json") << "{\"metadata\": {}, \"weight_map\": {" << map << "}}";
  std::ofstream(two + "/config.json") << *ReadFile(one + "/config.json");
  auto b = Make(c, be.get(), 99);
  ASSERT_TRUE(ImportHf(two, *b).ok());
  for (auto& p : a->params()) EXPECT_EQ(*b->GatherGlobal(*b->Find(p.name()), false), *a->GatherGlobal(p, false));

  // A model of another shape: the tensor, the file and both shapes are named.
  auto wide = c;
  wide.ffn = 32;
  auto w = Make(wide, be.get(), 1);
  EXPECT_THAT(std::string(ImportHf(one, *w).message()),
              HasSubstr("model.safetensors: model.layers.0.mlp.gate_proj.weight has shape [24, 16], the model expects [32, 16]"));
  // A tensor the file lacks (a Qwen2-style model asks for biases).
  auto biased = c;
  biased.qkv_bias = true;
  auto q = Make(biased, be.get(), 1);
  EXPECT_THAT(std::string(ImportHf(one, *q).message()), HasSubstr("no tensor 'model.layers.0.self_attn.q_proj.bias'"));

  // config.json: Hugging Face's keys; what we cannot run is refused naming the key.
  const std::string cfg = *ReadFile(one + "/config.json");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = cfg;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(one + "/config.json", std::ios::trunc) << text;
    return ReadHfConfig(one).status();
  };
  EXPECT_THAT(std::string(with("\"hidden_size\"", "\"initializer_range\"").message()), HasSubstr("hidden_size: is required"));
  // RoPE scalings: read with what each needs, refused naming what is missing or unknown.
  auto llama3 = with("\"rope_theta\"", "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, "
                     "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}, \"rope_theta\"");
  EXPECT_TRUE(llama3.ok()) << llama3;
  EXPECT_EQ(ReadHfConfig(one)->rope_scaling.type, model::RopeScaling::Type::kLlama3);
  EXPECT_EQ(ReadHfConfig(one)->rope_scaling.original_max_positions, 8192);
  auto half = with("\"rope_theta\"", "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0}, \"rope_theta\"");
  EXPECT_EQ(half.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(half.message()), HasSubstr("rope_scaling.low_freq_factor"));
  auto yarn = with("\"rope_theta\"", "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, "
                   "\"original_max_position_embeddings\": 32768}, \"rope_theta\"");
  EXPECT_TRUE(yarn.ok()) << yarn;
  EXPECT_EQ(ReadHfConfig(one)->rope_scaling.type, model::RopeScaling::Type::kYarn);
  auto longrope = with("\"rope_theta\"", "\"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 4.0}, \"rope_theta\"");
  EXPECT_EQ(longrope.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(longrope.message()), HasSubstr("rope_scaling.rope_type 'longrope' is not supported"));
  EXPECT_THAT(std::string(with("\"rope_theta\"", "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0, "
                               "\"short_factor\": [1.0]}, \"rope_theta\"").message()),
              HasSubstr("rope_scaling.short_factor is not supported"));
  // A key the engine does not implement is refused by name, never ignored.
  auto unknown = with("\"rope_theta\"", "\"logit_softcapping\": 30.0, \"rope_theta\"");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("logit_softcapping is not supported"));
  EXPECT_THAT(std::string(with("\"rope_theta\"", "\"layer_types\": [\"sliding_attention\"], \"rope_theta\"").message()),
              HasSubstr("layer_types: \"sliding_attention\" is not supported"));
  EXPECT_THAT(std::string(with("\"llama\"", "\"mistral\"").message()), HasSubstr("model_type 'mistral' is not supported"));
  // Qwen3: q/k norms; attention biases are not Qwen3's.
  ASSERT_TRUE(with("\"llama\"", "\"qwen3\"").ok());
  EXPECT_TRUE(ReadHfConfig(one)->qk_norm);
  EXPECT_THAT(std::string(with("\"attention_bias\": false", "\"attention_bias\": true").message()), HasSubstr("attention_bias"));
  EXPECT_THAT(std::string(with("\"silu\"", "\"gelu\"").message()), HasSubstr("hidden_act"));
  EXPECT_THAT(std::string(with("\"num_attention_heads\": 4", "\"num_attention_heads\": 3").message()), HasSubstr("config.json"));
  EXPECT_TRUE(with("\"rope_theta\"", "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000.0}, "
                   "\"initializer_range\"").ok());
  EXPECT_EQ(ReadHfConfig(one)->rope_base, 1000.f);
  EXPECT_EQ(ExportHf(one, *a, "F16", true).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::checkpoint
