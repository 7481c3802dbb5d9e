#include "worker/checkpoint/hf.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <thread>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/checkpoint/safetensors.h"
#include "common/dtype.h"

namespace tessera::checkpoint {
namespace {
using nlohmann::json;

// name -> the file holding it.
absl::StatusOr<std::map<std::string, std::string>> WeightFiles(const std::string& dir) {
  std::map<std::string, std::string> where;
  auto index = ReadFile(dir + "/model.safetensors.index.json");
  if (!index.ok()) return where;  // one file: model.safetensors
  const json j = json::parse(*index, nullptr, false);
  if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return absl::DataLossError(absl::StrCat(dir, "/model.safetensors.index.json: no weight_map object"));
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
      return absl::DataLossError(absl::StrCat(dir, "/model.safetensors.index.json: bad file for ", name));
    where[name] = file.get<std::string>();
  }
  return where;
}

}  // namespace

absl::Status ImportHf(const std::string& dir, model::Llama& model) {
  TESSERA_ASSIGN_OR_RETURN(auto where, WeightFiles(dir));
  // What to read: each parameter's file and tensor, checked before anything is read.
  struct Job {
    model::Param* p;
    const SafetensorsReader* file;
    tessera::DType dtype;           // as stored: f32 or bf16 (uploaded so, widened on the device), else f16
    std::unique_ptr<char[]> shard;  // this rank's slice, as stored (f16: converted to f32)
    absl::Status status;
  };
  std::map<std::string, std::unique_ptr<SafetensorsReader>> open;
  std::vector<Job> jobs;
  for (auto& p : model.params()) {
    const std::string file = where.empty() ? "model.safetensors" : (where.count(p.name()) ? where[p.name()] : "");
    // A critic started from a causal LM (PPO's usual start): the LM's weights, and the
    // value head as the model initialized it.
    const bool fresh_head = p.name() == "score.weight";
    if (file.empty() && fresh_head) continue;
    if (file.empty()) return absl::NotFoundError(absl::StrCat(dir, ": the index lists no file for ", p.name()));
    auto& r = open[file];
    if (r == nullptr) {
      TESSERA_ASSIGN_OR_RETURN(r, SafetensorsReader::Open(absl::StrCat(dir, "/", file)));
    }
    if (fresh_head && !r->Find(p.name()).ok()) continue;
    TESSERA_ASSIGN_OR_RETURN(const TensorInfo* info, r->Find(p.name()));
    if (info->shape != p.spec.shape)
      return absl::InvalidArgumentError(absl::StrCat(r->path(), ": ", p.name(), " has shape [", absl::StrJoin(info->shape, ", "),
                                                     "], the model expects [", absl::StrJoin(p.spec.shape, ", "), "]"));
    const tessera::DType dtype = info->dtype == "BF16" ? tessera::DType::kBF16 : info->dtype == "F32" ? tessera::DType::kF32
                                                                                                      : tessera::DType::kF16;
    jobs.push_back({&p, r.get(), dtype, nullptr, absl::OkStatus()});
  }
  // Each rank reads only its slices; threads read and convert the parameters of a window
  // in parallel while this thread uploads them in order (host memory: one window).
  const int threads = static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8));
  auto read = [&model](Job& j) {
    const model::TpSplit split = model.SplitOf(*j.p);
    const size_t n = static_cast<size_t>(j.p->value.numel());
    if (j.dtype == tessera::DType::kF16) {  // no f16 on the device side: widened here
      j.shard.reset(new char[n * 4]);
      j.status = j.file->ReadF32SliceInto(j.p->name(), split.dim, split.parts, split.index,
                                          reinterpret_cast<float*>(j.shard.get()));
    } else {
      j.shard.reset(new char[n * tessera::DTypeSize(j.dtype)]);
      j.status = j.file->ReadRawSliceInto(j.p->name(), split.dim, split.parts, split.index, j.shard.get());
    }
  };
  // A bf16 slice goes up as it is stored (half the bytes of f32) and is widened into the
  // f32 master weights on the device.
  runtime::Backend& be = model.backend();
  runtime::Tensor staging;
  auto upload = [&](Job& j) -> absl::Status {
    if (j.dtype != tessera::DType::kBF16) return model.SetShard(*j.p, reinterpret_cast<const float*>(j.shard.get()));
    if (staging.numel() < j.p->value.numel()) {
      staging = runtime::Tensor();
      TESSERA_ASSIGN_OR_RETURN(staging, be.Empty({j.p->value.numel()}, tessera::DType::kBF16));
    }
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor part, staging.Slice(0, 0, j.p->value.numel()));
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor src, part.Reshape(j.p->value.shape()));
    TESSERA_RETURN_IF_ERROR(be.CopyFromHost(j.shard.get(), src));
    TESSERA_RETURN_IF_ERROR(be.Cast(src, j.p->value));
    return model.RefreshCompute(*j.p);
  };
  std::vector<std::future<void>> pending(jobs.size());
  size_t next = 0;
  auto launch = [&] {
    if (next < jobs.size()) {
      pending[next] = std::async(std::launch::async, read, std::ref(jobs[next]));
      ++next;
    }
  };
  for (int k = 0; k < threads; ++k) launch();
  absl::Status status;
  for (size_t i = 0; i < next; ++i) {  // `next` stops growing at an error
    pending[i].get();
    if (status.ok()) status = jobs[i].status;
    if (status.ok()) status = upload(jobs[i]);
    jobs[i].shard.reset();
    if (status.ok()) launch();  // on an error, only what is running finishes
  }
  if (status.ok()) status = be.Synchronize();  // the staging buffer is reused: the last copy done before it goes
  return status;
}

namespace {
// rope_scaling as transformers 4 spells it (transformers 5 reads it too).
json RopeScalingJson(const model::RopeScaling& s) {
  using T = model::RopeScaling::Type;
  json r = {{"rope_type", model::RopeTypeName(s.type)}, {"factor", s.factor}};
  if (s.original_max_positions > 0) r["original_max_position_embeddings"] = s.original_max_positions;
  if (s.type == T::kLlama3) r["low_freq_factor"] = s.low_freq_factor, r["high_freq_factor"] = s.high_freq_factor;
  if (s.type == T::kYarn) {
    r["beta_fast"] = s.beta_fast, r["beta_slow"] = s.beta_slow, r["truncate"] = s.truncate;
    if (s.attention_factor > 0) r["attention_factor"] = s.attention_factor;
    if (s.mscale > 0) r["mscale"] = s.mscale;
    if (s.mscale_all_dim > 0) r["mscale_all_dim"] = s.mscale_all_dim;
  }
  return r;
}
}  // namespace

absl::Status ExportHf(const std::string& dir, model::Llama& model, const std::string& dtype, bool write,
                      comm::Communicator* pp, int64_t max_shard_bytes) {
  if (dtype != "BF16" && dtype != "F32")
    return absl::InvalidArgumentError(absl::StrCat("export: dtype must be BF16 or F32, got '", dtype, "'"));
  if (max_shard_bytes <= 0)
    return absl::InvalidArgumentError(absl::StrCat("export: max_shard_bytes must be > 0, got ", max_shard_bytes));
  const model::LlamaConfig& c = model.config();
  const model::StageSpec& stage = model.stage();
  const int pps = pp != nullptr ? pp->size() : 1, me = pp != nullptr ? pp->rank() : 0;
  if (pps != stage.pp) return absl::InvalidArgumentError("export: the pipeline group does not match the model's stages");
  write = write && me == 0;  // stage 0 writes; the other stages send what they hold first
  const auto specs = model::LlamaParamSpecs(c);
  const int elem = dtype == "BF16" ? 2 : 4;
  // The files: consecutive tensors up to max_shard_bytes each (a larger tensor alone).
  std::vector<int> file_of(specs.size());
  std::vector<int64_t> file_bytes;
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t bytes = elem;
    for (int64_t d : specs[i].shape) bytes *= d;
    if (file_bytes.empty() || file_bytes.back() + bytes > max_shard_bytes) file_bytes.push_back(0);
    file_bytes.back() += bytes;
    file_of[i] = static_cast<int>(file_bytes.size()) - 1;
  }
  const int files = static_cast<int>(file_bytes.size());
  auto file_name = [files](int k) {
    return files == 1 ? std::string("model.safetensors") : absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, files);
  };
  // One tensor at a time, in the specs' order on every rank (TP gathers and pipeline
  // sends are collectives): host memory of the largest tensor, not of the model.
  std::vector<float> global;
  std::vector<uint16_t> low;
  size_t fetched = 0;
  auto fetch = [&](size_t i) -> absl::Status {
    const auto& spec = specs[i];
    fetched = i + 1;
    int owner = 0;  // the first stage holding it (a tied embedding: stage 0)
    while (owner < pps && !model::StageHolds(spec.name, c, model::StageSpec{pps, owner, stage.vpp, stage.last_layers, stage.stage_layers})) ++owner;
    if (owner == pps) return absl::InternalError(absl::StrCat("export: no stage holds ", spec.name));
    global.clear();
    if (me == owner) {
      model::Param* p = model.Find(spec.name);
      if (p == nullptr) return absl::InternalError(absl::StrCat("export: stage ", me, " lacks ", spec.name));
      TESSERA_ASSIGN_OR_RETURN(global, model.GatherGlobal(*p, false));  // every TP rank of the stage
    }
    if (owner != 0 && (me == owner || me == 0)) {
      int64_t n = 1;
      for (int64_t d : spec.shape) n *= d;
      if (me == 0) {
        global.resize(n);
        TESSERA_RETURN_IF_ERROR(pp->Recv(global.data(), n, tessera::DType::kF32, owner));
      } else {
        TESSERA_RETURN_IF_ERROR(pp->Send(global.data(), n, tessera::DType::kF32, 0));
      }
    }
    if (write && elem == 2) {
      low.resize(global.size());
      for (size_t k = 0; k < global.size(); ++k) low[k] = tessera::FloatToBf16(global[k]);
    }
    return absl::OkStatus();
  };
  if (!write) {
    for (size_t i = 0; i < specs.size(); ++i) TESSERA_RETURN_IF_ERROR(fetch(i));
    return absl::OkStatus();
  }
  absl::Status status = MakeDirs(dir);
  // An earlier export's weight files go first: a stale index would name the wrong files.
  if (DIR* d = status.ok() ? ::opendir(dir.c_str()) : nullptr) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n == "model.safetensors" || n == "model.safetensors.index.json" ||
          (absl::StartsWith(n, "model-") && absl::StrContains(n, "-of-") && absl::EndsWith(n, ".safetensors")))
        ::unlink(absl::StrCat(dir, "/", n).c_str());
    }
    ::closedir(d);
  }
  bool fetch_failed = false;
  json weight_map = json::object();
  for (int k = 0; k < files && status.ok(); ++k) {
    std::vector<TensorToWrite> tensors;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (file_of[i] != k) continue;
      weight_map[specs[i].name] = file_name(k);
      int64_t n = 1;
      for (int64_t d : specs[i].shape) n *= d;
      tensors.push_back({specs[i].name, dtype, specs[i].shape, nullptr, static_cast<size_t>(n * elem),
                         [&, i]() -> absl::StatusOr<const void*> {
                           if (absl::Status st = fetch(i); !st.ok()) {
                             fetch_failed = true;
                             return st;
                           }
                           return elem == 2 ? static_cast<const void*>(low.data()) : global.data();
                         }});
    }
    status = WriteSafetensors(absl::StrCat(dir, "/", file_name(k)), tensors, {{"format", "pt"}});
  }
  if (!status.ok()) {
    // A write that failed (the directory or the disk, not a collective): the other ranks
    // still wait in the remaining gathers and sends; take part in them before returning.
    if (!fetch_failed)
      for (size_t i = fetched; i < specs.size(); ++i)
        if (!fetch(i).ok()) break;
    return status;
  }
  if (files > 1) {
    int64_t total = 0;
    for (int64_t b : file_bytes) total += b;
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    TESSERA_RETURN_IF_ERROR(WriteFileAtomic(dir + "/model.safetensors.index.json", index.dump(2)));
  }
  const char* family = c.qk_norm ? "Qwen3" : c.qkv_bias ? "Qwen2" : "Llama";
  const std::string arch = absl::StrCat(family, c.value_head ? "ForTokenClassification" : "ForCausalLM");
  json cfg = {{"architectures", {arch}},
              {"model_type", c.qk_norm ? "qwen3" : c.qkv_bias ? "qwen2" : "llama"},
              {"vocab_size", c.vocab},
              {"hidden_size", c.hidden},
              {"intermediate_size", c.ffn},
              {"num_hidden_layers", c.layers},
              {"num_attention_heads", c.heads},
              {"num_key_value_heads", c.kv_heads},
              {"head_dim", c.HeadDim()},
              {"hidden_act", "silu"},
              {"rms_norm_eps", c.norm_eps},
              {"rope_theta", c.rope_base},
              {"tie_word_embeddings", c.tie_embeddings},
              {"torch_dtype", dtype == "BF16" ? "bfloat16" : "float32"},
              {"max_position_embeddings", c.max_positions > 0 ? c.max_positions : 4096}};
  if (!c.qkv_bias) cfg["attention_bias"] = false;
  if (c.rope_scaling.type != model::RopeScaling::Type::kDefault) cfg["rope_scaling"] = RopeScalingJson(c.rope_scaling);
  if (c.value_head) cfg["id2label"] = {{"0", "LABEL_0"}}, cfg["label2id"] = {{"LABEL_0", 0}};  // one label: the value
  return WriteFileAtomic(dir + "/config.json", cfg.dump(2));
}

}  // namespace tessera::checkpoint
