#include "worker/checkpoint/hf.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <future>
#include <mutex>
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

absl::Status ImportHf(const std::string& dir, model::Llama& model, int64_t piece_bytes) {
  if (piece_bytes <= 0)
    return absl::InvalidArgumentError(absl::StrCat("import: piece_bytes must be > 0, got ", piece_bytes));
  TESSERA_ASSIGN_OR_RETURN(auto where, WeightFiles(dir));
  // What to read: each parameter's file and tensor, checked before anything is read.
  struct Job {
    model::Param* p;
    const SafetensorsReader* file;
    tessera::DType dtype;  // as stored
    model::TpSplit split;  // what this rank holds of it
    int64_t row_elems;     // the slice as rows (SafetensorsReader::SliceRows)
  };
  std::map<std::string, std::unique_ptr<SafetensorsReader>> open;
  std::vector<Job> jobs;
  for (auto& p : model.params()) {
    const std::string file = where.empty() ? "model.safetensors" : (where.count(p.name()) ? where[p.name()] : "");
    // A critic started from a causal LM (PPO's usual start): the LM's weights, and the
    // value head as the model initialized it. A reward model's head is its score: read.
    const bool fresh_head = p.name() == "score.weight" && !model.config().sequence_score;
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
    const tessera::DType dtype = info->dtype == "BF16" ? tessera::DType::kBF16
                                 : info->dtype == "F16" ? tessera::DType::kF16
                                                        : tessera::DType::kF32;
    if (info->dtype != "BF16" && info->dtype != "F16" && info->dtype != "F32")
      return absl::InvalidArgumentError(absl::StrCat(r->path(), ": ", p.name(), " is ", info->dtype, ", expected F32, BF16 or F16"));
    const model::TpSplit split = model.SplitOf(p);
    TESSERA_ASSIGN_OR_RETURN(const auto rows, r->SliceRows(p.name(), split.dim, split.parts));
    if (rows.first * rows.second != p.value.numel())
      return absl::InternalError(absl::StrCat(p.name(), ": this rank's slice has ", rows.first * rows.second,
                                              " elements, the model holds ", p.value.numel()));
    jobs.push_back({&p, r.get(), dtype, split, rows.second});
  }
  // The reads: consecutive rows of a slice, about piece_bytes as stored each (a row is
  // never split). Threads read pieces into staging buffers (page-locked on a GPU) while
  // this thread uploads them in order: as stored (a 16-bit source is half the bytes of
  // f32), widened into the f32 values on the device. Host memory: the buffers alone.
  struct Piece {
    size_t job;
    int64_t begin, end;  // rows of the slice
  };
  std::vector<Piece> pieces;
  int64_t buffer_bytes = 1;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int64_t rows = jobs[j].p->value.numel() / std::max<int64_t>(jobs[j].row_elems, 1);
    const int64_t row_bytes = std::max<int64_t>(jobs[j].row_elems * tessera::DTypeSize(jobs[j].dtype), 1);
    const int64_t per = std::max<int64_t>(piece_bytes / row_bytes, 1);
    for (int64_t b = 0; b < rows; b += per) {
      pieces.push_back({j, b, std::min(rows, b + per)});
      buffer_bytes = std::max(buffer_bytes, (pieces.back().end - b) * row_bytes);
    }
  }
  runtime::Backend& be = model.backend();
  const int threads = static_cast<int>(
      std::min<size_t>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8), std::max<size_t>(pieces.size(), 1)));
  std::vector<runtime::Backend::HostBuffer> buffers;
  for (int k = 0; k < threads; ++k) {
    TESSERA_ASSIGN_OR_RETURN(auto b, be.AllocHostStaging(static_cast<size_t>(buffer_bytes)));
    buffers.push_back(std::move(b));
  }
  std::vector<absl::Status> read_status(pieces.size());
  auto read = [&](size_t i) {
    const Piece& piece = pieces[i];
    const Job& j = jobs[piece.job];
    read_status[i] = j.file->ReadRawSliceRowsInto(j.p->name(), j.split.dim, j.split.parts, j.split.index, piece.begin,
                                                  piece.end, buffers[i % threads].get());
  };
  std::map<tessera::DType, runtime::Tensor> staging;  // per source dtype that is not the value's
  auto upload = [&](size_t i) -> absl::Status {
    const Piece& piece = pieces[i];
    const Job& j = jobs[piece.job];
    const int64_t first = piece.begin * j.row_elems, n = (piece.end - piece.begin) * j.row_elems;
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor flat, j.p->value.Reshape({j.p->value.numel()}));
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor dst, flat.Slice(0, first, n));
    if (j.dtype == j.p->value.dtype()) {
      TESSERA_RETURN_IF_ERROR(be.CopyFromHost(buffers[i % threads].get(), dst));
    } else {
      runtime::Tensor& stage = staging[j.dtype];
      if (!stage.defined()) {
        TESSERA_ASSIGN_OR_RETURN(stage, be.Empty({static_cast<int64_t>(buffer_bytes / tessera::DTypeSize(j.dtype))}, j.dtype));
      }
      TESSERA_ASSIGN_OR_RETURN(runtime::Tensor src, stage.Slice(0, 0, n));
      TESSERA_RETURN_IF_ERROR(be.CopyFromHost(buffers[i % threads].get(), src));
      TESSERA_RETURN_IF_ERROR(be.Cast(src, dst));
    }
    TESSERA_RETURN_IF_ERROR(be.Synchronize());  // the buffer is read into again next
    const bool last = i + 1 == pieces.size() || pieces[i + 1].job != piece.job;
    return last ? model.RefreshCompute(*j.p) : absl::OkStatus();
  };
  std::vector<std::future<void>> pending(pieces.size());
  size_t next = 0;
  auto launch = [&] {
    if (next < pieces.size()) {
      pending[next] = std::async(std::launch::async, read, next);
      ++next;
    }
  };
  for (int k = 0; k < threads; ++k) launch();
  absl::Status status;
  for (size_t i = 0; i < next; ++i) {  // `next` stops growing at an error
    pending[i].get();
    if (status.ok()) status = read_status[i];
    if (status.ok()) status = upload(i);
    if (status.ok()) launch();  // on an error, only what is running finishes
  }
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
  // sends are collectives), gathered and cast to the file's dtype on the device; the
  // writing rank copies it into one of two host buffers, which a writer thread puts into
  // the files while the next tensor is gathered. Host memory: two of the largest tensor.
  runtime::Backend& be = model.backend();
  auto numel_of = [&](size_t i) {
    int64_t n = 1;
    for (int64_t d : specs[i].shape) n *= d;
    return n;
  };
  // Tensor i onto the device (owner's stage gathers over TP; stage 0 receives it), then,
  // with `host` given, into host memory in the file's dtype.
  auto fetch = [&](size_t i, char* host) -> absl::Status {
    const auto& spec = specs[i];
    int owner = 0;  // the first stage holding it (a tied embedding: stage 0)
    while (owner < pps && !model::StageHolds(spec.name, c, model::StageSpec{pps, owner, stage.vpp, stage.last_layers, stage.stage_layers})) ++owner;
    if (owner == pps) return absl::InternalError(absl::StrCat("export: no stage holds ", spec.name));
    if (me != owner && me != 0) return absl::OkStatus();
    const int64_t n = numel_of(i);
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor whole, be.Empty({n}, tessera::DType::kF32));
    if (me == owner) {
      model::Param* p = model.Find(spec.name);
      if (p == nullptr) return absl::InternalError(absl::StrCat("export: stage ", me, " lacks ", spec.name));
      TESSERA_RETURN_IF_ERROR(model.GatherGlobalInto(*p, whole));  // every TP rank of the stage
    }
    if (owner != 0) {
      if (me == 0) TESSERA_RETURN_IF_ERROR(pp->Recv(whole.data(), n, tessera::DType::kF32, owner));
      else TESSERA_RETURN_IF_ERROR(pp->Send(whole.data(), n, tessera::DType::kF32, 0));
    }
    if (me != 0 || host == nullptr) return absl::OkStatus();
    if (elem == 4) return be.CopyToHost(whole, host);
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor low, be.Empty({n}, tessera::DType::kBF16));
    TESSERA_RETURN_IF_ERROR(be.Cast(whole, low));
    return be.CopyToHost(low, host);
  };
  if (!write) {
    for (size_t i = 0; i < specs.size(); ++i) TESSERA_RETURN_IF_ERROR(fetch(i, nullptr));
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
  int64_t largest = 1;
  for (size_t i = 0; i < specs.size(); ++i) largest = std::max(largest, numel_of(i) * elem);
  std::unique_ptr<char[]> slot[2];
  // The hand-over: tensors [0, ready) are in their slots (i in slot i % 2); the writer has
  // asked for [0, asked), so tensor asked - 2 and those before are in the files.
  std::mutex mu;
  std::condition_variable cv;
  size_t ready = 0, asked = 0;
  bool writer_done = false;
  absl::Status fetch_status;
  json weight_map = json::object();
  std::vector<std::vector<TensorToWrite>> file_tensors(files);
  for (size_t i = 0; i < specs.size(); ++i) {
    weight_map[specs[i].name] = file_name(file_of[i]);
    file_tensors[file_of[i]].push_back(
        {specs[i].name, dtype, specs[i].shape, nullptr, static_cast<size_t>(numel_of(i) * elem),
         [&, i]() -> absl::StatusOr<const void*> {
           std::unique_lock<std::mutex> l(mu);
           asked = i + 1;
           cv.notify_all();
           cv.wait(l, [&] { return ready > i || !fetch_status.ok(); });
           if (ready <= i) return fetch_status;
           return static_cast<const void*>(slot[i % 2].get());
         }});
  }
  std::thread writer;
  writer_done = !status.ok();
  if (status.ok()) {
    writer = std::thread([&] {
      absl::Status st;
      for (int k = 0; k < files && st.ok(); ++k) st = WriteSafetensors(absl::StrCat(dir, "/", file_name(k)), file_tensors[k], {{"format", "pt"}});
      std::lock_guard<std::mutex> l(mu);
      status = st;
      writer_done = true;
      cv.notify_all();
    });
  }
  // Every tensor is fetched (the other ranks wait in its collectives) even after a write
  // failed; after a collective failed, none is.
  for (size_t i = 0; i < specs.size(); ++i) {
    char* host = nullptr;
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return writer_done || i < 2 || asked >= i; });  // slot i % 2 written out
      if (!writer_done && status.ok()) {
        if (slot[i % 2] == nullptr) slot[i % 2].reset(new char[largest]);
        host = slot[i % 2].get();
      }
    }
    const absl::Status st = fetch(i, host);
    std::lock_guard<std::mutex> l(mu);
    if (!st.ok()) {
      fetch_status = st;
      cv.notify_all();
      break;
    }
    ready = i + 1;
    cv.notify_all();
  }
  if (writer.joinable()) writer.join();
  if (!fetch_status.ok() || !status.ok()) {  // no half-written model stays behind
    for (int k = 0; k < files; ++k) ::unlink(absl::StrCat(dir, "/", file_name(k)).c_str());
    return !fetch_status.ok() ? fetch_status : status;
  }
  if (files > 1) {
    int64_t total = 0;
    for (int64_t b : file_bytes) total += b;
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    TESSERA_RETURN_IF_ERROR(WriteFileAtomic(dir + "/model.safetensors.index.json", index.dump(2)));
  }
  const char* family = c.qk_norm ? "Qwen3" : c.qkv_bias ? "Qwen2" : "Llama";
  const std::string arch = absl::StrCat(family, !c.value_head      ? "ForCausalLM"
                                                 : c.sequence_score ? "ForSequenceClassification"
                                                                    : "ForTokenClassification");
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
