#include "worker/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "common/util.h"
#include "spdlog/spdlog.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/safetensors.h"

namespace tessera::checkpoint {
namespace {
using nlohmann::json;
constexpr const char* kFormat = kCheckpointFormat;

int TpRank(const Group& g) { return g.tp ? g.tp->rank() : 0; }
int TpSize(const Group& g) { return g.tp ? g.tp->size() : 1; }
int DpRank(const Group& g) { return g.dp ? g.dp->rank() : 0; }
int DpSize(const Group& g) { return g.dp ? g.dp->size() : 1; }
int PpRank(const Group& g) { return g.pp ? g.pp->rank() : 0; }
int PpSize(const Group& g) { return g.pp ? g.pp->size() : 1; }
int WorldRank(const Group& g, int tp_r, int dp_r, int pp_r) { return tp_r + TpSize(g) * (dp_r + DpSize(g) * pp_r); }

std::string RankFile(int rank, const char* ext) { return absl::StrFormat("rank-%05d.%s", rank, ext); }

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// What TP rank tp_r, DP rank dp_r writes of a parameter (see the header).
struct Plan {
  int tp_dim = -1, tp_size = 1, tp_index = 0;  // the TP slice written (model::TpSplitOf)
  bool value = false, state = false;
  int64_t value_begin = 0, value_len = 0, state_begin = 0, state_len = 0;
};
// zero: the stage (moments sliced from 1); sliced: whether the values are too
// (engine::Trainer::values_sliced).
Plan PlanFor(const model::ParamSpec& spec, int tp, int dp, int zero, bool sliced, int tp_r, int dp_r) {
  Plan p;
  const model::TpSplit split = model::TpSplitOf(spec, tp, tp_r);
  // TP ranks holding the same tensor (or the same replicated KV head): the first writes it.
  if (split.replica != 0) return p;
  const bool tp_sharded = split.dim >= 0 && split.parts > 1;
  p.tp_dim = tp_sharded ? split.dim : -1;
  p.tp_size = tp_sharded ? split.parts : 1;
  p.tp_index = tp_sharded ? split.index : 0;
  const int64_t n = Numel(spec.shape) / p.tp_size;
  const int64_t shard = (n + dp - 1) / dp, begin = std::min<int64_t>(n, dp_r * shard),
                len = std::min<int64_t>(shard, n - begin);
  if (sliced && dp > 1) {
    p.value = len > 0, p.value_begin = begin, p.value_len = len;
  } else if (dp_r == 0) {
    p.value = true, p.value_len = n;
  }
  if (zero >= 1 && dp > 1) {
    p.state = len > 0, p.state_begin = begin, p.state_len = len;
  } else if (dp_r == 0) {
    p.state = true, p.state_len = n;
  }
  return p;
}

// Every rank learns whether every rank succeeded (an all-reduce of a failure flag over TP,
// then DP): no rank is left waiting in a later collective when another one failed.
absl::Status Agree(const Group& g, const absl::Status& local, const char* phase) {
  runtime::Backend& b = g.trainer != nullptr ? *g.trainer->backend() : g.model->backend();
  float flag = local.ok() ? 0.f : 1.f;
  auto reduce = [&](comm::Communicator* c) -> absl::Status {
    if (c == nullptr || c->size() == 1) return absl::OkStatus();
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor t, b.Empty({1}, tessera::DType::kF32));
    TESSERA_RETURN_IF_ERROR(b.CopyFromHost(&flag, t));
    TESSERA_RETURN_IF_ERROR(c->AllReduce(t.data(), t.data(), 1, tessera::DType::kF32, comm::ReduceOp::kMax));
    return b.CopyToHost(t, &flag);
  };
  TESSERA_RETURN_IF_ERROR(reduce(g.tp));
  TESSERA_RETURN_IF_ERROR(reduce(g.dp));
  TESSERA_RETURN_IF_ERROR(reduce(g.pp));
  TESSERA_RETURN_IF_ERROR(reduce(g.dp));  // peers may only now have learnt of a failure elsewhere
  TESSERA_RETURN_IF_ERROR(reduce(g.tp));
  if (!local.ok()) return local;
  if (flag != 0.f) return absl::AbortedError(absl::StrCat("checkpoint ", phase, " failed on another rank"));
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open directory ", dir, ": ", strerror(errno)));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot sync directory ", dir, ": ", strerror(errno)));
  return absl::OkStatus();
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

// This rank's shard file and its sidecar (size and SHA-256), if it holds anything to write.
// Streamed: one parameter's piece is read from the trainer when the file reaches it and
// dropped after its tensors are written (host memory of the largest parameter, not of the
// whole shard), and the file is hashed as it is written (not read back).
absl::Status WriteRankFile(const std::string& tmp, int rank, const Group& g) {
  auto& params = g.model->params();
  std::vector<TensorToWrite> tensors;
  const int tp = TpSize(g), dp = DpSize(g), zero = g.trainer->zero();
  const auto& stage = g.model->stage();
  size_t held = params.size();  // the parameter whose piece is in `piece`
  engine::Trainer::Piece piece;
  // The piece of parameter i, read when first needed; `part` 0 value, 1 m, 2 v.
  auto producer = [&](size_t i, int part, const Plan plan) {
    return [&, i, part, plan]() -> absl::StatusOr<const void*> {
      if (held != i) {
        piece = engine::Trainer::Piece();  // the last one's memory first
        TESSERA_ASSIGN_OR_RETURN(piece, g.trainer->ReadPiece(i));
        held = i;
        if (piece.value_begin != plan.value_begin || static_cast<int64_t>(piece.value.size()) < plan.value_len ||
            piece.state_begin != plan.state_begin || static_cast<int64_t>(piece.m.size()) < plan.state_len)
          return absl::InternalError(
              absl::StrCat("checkpoint: ", params[i].name(), ": the trainer holds other elements than planned"));
      }
      return static_cast<const void*>(part == 0 ? piece.value.data() : part == 1 ? piece.m.data() : piece.v.data());
    };
  };
  for (size_t i = 0; i < params.size(); ++i) {
    if (model::StageOf(params[i].name(), g.model->config(), stage) != PpRank(g)) continue;
    const Plan plan = PlanFor(params[i].spec, tp, dp, zero, g.trainer->values_sliced(), TpRank(g), DpRank(g));
    if (!plan.value && !plan.state) continue;
    const std::string& name = params[i].name();
    if (plan.value)
      tensors.push_back({name, "F32", {plan.value_len}, nullptr, size_t(plan.value_len) * 4, producer(i, 0, plan)});
    if (plan.state) {
      tensors.push_back({name + "/exp_avg", "F32", {plan.state_len}, nullptr, size_t(plan.state_len) * 4, producer(i, 1, plan)});
      tensors.push_back({name + "/exp_avg_sq", "F32", {plan.state_len}, nullptr, size_t(plan.state_len) * 4, producer(i, 2, plan)});
    }
  }
  if (tensors.empty()) return absl::OkStatus();
  const std::string file = absl::StrCat(tmp, "/", RankFile(rank, "safetensors"));
  std::string sha;
  TESSERA_RETURN_IF_ERROR(WriteSafetensors(file, tensors, {{"format", kFormat}}, &sha));
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return absl::InternalError(absl::StrCat("cannot stat ", file));
  const json side = {{"bytes", static_cast<int64_t>(st.st_size)}, {"sha256", sha}};
  return WriteFileAtomic(absl::StrCat(tmp, "/", RankFile(rank, "sha256")), side.dump());
}

// Rank 0: the metadata of every rank's shards, then the commit.
absl::Status CommitOnRankZero(const std::string& dir, const std::string& tmp, const std::string& final_dir,
                              int64_t step, const Group& g) {
  const int tp = TpSize(g), dp = DpSize(g), zero = g.trainer->zero();
  const auto& c = g.model->config();
  json tensors = json::object(), files = json::object();
  for (const auto& p : model::LlamaParamSpecs(c)) {  // every parameter: rank 0 may hold only its stage's
    json value = json::array(), m = json::array(), v = json::array();
    const int stage = model::StageOf(p.name, c, g.model->stage());  // a tied embedding: stage 0's
    for (int d = 0; d < dp; ++d)
      for (int t = 0; t < tp; ++t) {
        const Plan plan = PlanFor(p, tp, dp, zero, g.trainer->values_sliced(), t, d);
        if (!plan.value && !plan.state) continue;
        const int rank = WorldRank(g, t, d, stage);
        const std::string file = RankFile(rank, "safetensors");
        if (!files.contains(file)) {
          TESSERA_ASSIGN_OR_RETURN(std::string side, ReadFile(absl::StrCat(tmp, "/", RankFile(rank, "sha256"))));
          files[file] = json::parse(side, nullptr, false);
        }
        auto shard = [&](const std::string& key, int64_t begin, int64_t len) {
          return json{{"file", file}, {"key", key},   {"tp_dim", plan.tp_dim}, {"tp_rank", plan.tp_index},
                      {"tp_size", plan.tp_size}, {"begin", begin}, {"len", len}};
        };
        if (plan.value) value.push_back(shard(p.name, plan.value_begin, plan.value_len));
        if (plan.state) {
          m.push_back(shard(p.name + "/exp_avg", plan.state_begin, plan.state_len));
          v.push_back(shard(p.name + "/exp_avg_sq", plan.state_begin, plan.state_len));
        }
      }
    tensors[p.name] = {{"shape", p.shape}, {"value", value}, {"exp_avg", m}, {"exp_avg_sq", v}};
  }
  const json meta = {{"format", kFormat},
                     {"step", step},
                     {"layout", {{"tp", tp}, {"dp", dp}, {"pp", PpSize(g)}, {"vpp", g.model->stage().vpp}, {"zero", zero}}},
                     {"model",
                      {{"vocab", c.vocab}, {"hidden", c.hidden}, {"layers", c.layers}, {"heads", c.heads},
                       {"kv_heads", c.kv_heads}, {"head_dim", c.HeadDim()}, {"ffn", c.ffn},
                       {"tie_embeddings", c.tie_embeddings}, {"qkv_bias", c.qkv_bias}, {"qk_norm", c.qk_norm},
                       {"rope_type", model::RopeTypeName(c.rope_scaling.type)}}},
                     {"files", files},
                     {"tensors", tensors}};
  TESSERA_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/metadata.json", meta.dump(1)));
  TESSERA_RETURN_IF_ERROR(FsyncDir(tmp));
  TESSERA_RETURN_IF_ERROR(RemoveTree(final_dir));  // an earlier save of the same step, if any
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", final_dir, ": ", strerror(errno)));
  TESSERA_RETURN_IF_ERROR(FsyncDir(dir));
  TESSERA_RETURN_IF_ERROR(WriteFileAtomic(dir + "/latest", StepDirName(step) + "\n"));
  return FsyncDir(dir);
}

absl::StatusOr<int64_t> LoadLocal(const std::string& path, const Group& g) {
  TESSERA_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(path));
  auto& params = g.model->params();
  for (size_t i = 0; i < params.size(); ++i) {
    const model::ParamSpec& spec = params[i].spec;
    if (g.trainer == nullptr) {  // weights only (inference): the values into the model
      TESSERA_ASSIGN_OR_RETURN(std::vector<float> global, reader->Read(spec.name, "value", spec.shape));
      TESSERA_RETURN_IF_ERROR(g.model->SetGlobal(params[i], global));
      continue;
    }
    // Only what this rank holds: under ZeRO its slice of the moments (of the value too
    // where the trainer keeps values sliced).
    const engine::Trainer::PieceSlices sl = g.trainer->SlicesOf(i);
    const model::TpSplit split = g.model->SplitOf(params[i]);
    engine::Trainer::Piece p;
    p.value_begin = sl.value_begin, p.state_begin = sl.state_begin;
    auto read = [&](const char* part, int64_t begin, int64_t len) {
      return reader->ReadTpShard(spec.name, part, spec.shape, split.dim, split.parts, split.index, begin, len);
    };
    TESSERA_ASSIGN_OR_RETURN(p.value, read("value", sl.value_begin, sl.value_len));
    TESSERA_ASSIGN_OR_RETURN(p.m, read("exp_avg", sl.state_begin, sl.state_len));
    TESSERA_ASSIGN_OR_RETURN(p.v, read("exp_avg_sq", sl.state_begin, sl.state_len));
    TESSERA_RETURN_IF_ERROR(g.trainer->LoadPiece(i, p));
  }
  if (g.trainer != nullptr) TESSERA_RETURN_IF_ERROR(g.trainer->GatherComputes());  // from the loaded slices
  return reader->step();
}

}  // namespace

std::string StepDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

absl::Status SaveCheckpoint(const std::string& dir, int64_t step, const Group& g, int keep) {
  if (g.model == nullptr || g.trainer == nullptr) return absl::InvalidArgumentError("checkpoint: no model or trainer");
  const int rank = WorldRank(g, TpRank(g), DpRank(g), PpRank(g));
  const std::string final_dir = absl::StrCat(dir, "/", StepDirName(step)), tmp = final_dir + ".tmp";
  absl::Status st;
  if (rank == 0) {
    st = MakeDirs(dir);
    if (st.ok()) st = RemoveTree(tmp);  // left by a save that crashed
    if (st.ok()) st = MakeDirs(tmp);
  }
  TESSERA_RETURN_IF_ERROR(Agree(g, st, "set-up"));
  // A save that fails (a full disk, say) leaves the previous checkpoint the latest and
  // takes its partial files away, so that they do not keep the disk full.
  auto cleanup_on_failure = [&](absl::Status failed) {
    if (!failed.ok() && rank == 0) (void)RemoveTree(tmp);
    return failed;
  };
  TESSERA_RETURN_IF_ERROR(cleanup_on_failure(Agree(g, WriteRankFile(tmp, rank, g), "write")));
  if (rank == 0) st = CommitOnRankZero(dir, tmp, final_dir, step, g);
  TESSERA_RETURN_IF_ERROR(cleanup_on_failure(Agree(g, st, "commit")));
  if (rank == 0 && keep > 0) {
    auto removed = PruneCheckpoints(dir, keep);
    if (!removed.ok()) spdlog::warn("checkpoint: keeping the newest {} in {} failed: {}", keep, dir, removed.status().ToString());
    else if (!removed->empty()) spdlog::info("checkpoint: removed {} (keep {})", absl::StrJoin(*removed, ", "), keep);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& dir, int keep) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  std::string latest;  // never removed; a `latest` that cannot be read removes nothing
  if (auto l = LatestCheckpoint(dir); l.ok()) latest = l->substr(dir.size() + 1);
  else if (l.status().code() != absl::StatusCode::kNotFound) return l.status();
  std::vector<std::pair<int64_t, std::string>> steps;  // committed step-N directories
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t n = 0;
    if (name.rfind("step-", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &n) || name.size() < 13 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos || !e.is_directory())
      continue;
    steps.emplace_back(n, name);
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::sort(steps.begin(), steps.end(), std::greater<>());
  for (size_t i = static_cast<size_t>(keep); i < steps.size(); ++i) {
    if (steps[i].second == latest) continue;
    TESSERA_RETURN_IF_ERROR(RemoveTree(absl::StrCat(dir, "/", steps[i].second)));
    removed.push_back(steps[i].second);
  }
  std::reverse(removed.begin(), removed.end());
  return removed;
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir) {
  auto text = ReadFile(dir + "/latest");
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir, " yet (no ", dir, "/latest)"));
  const std::string name(absl::StripAsciiWhitespace(*text));
  if (name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos)
    return absl::DataLossError(absl::StrCat(dir, "/latest: expected a step-N directory name, got '", name, "'"));
  return absl::StrCat(dir, "/", name);
}

absl::StatusOr<int64_t> LoadCheckpoint(const std::string& path, const Group& g) {
  if (g.model == nullptr) return absl::InvalidArgumentError("checkpoint: no model");
  auto step = LoadLocal(path, g);
  TESSERA_RETURN_IF_ERROR(Agree(g, step.status(), "load"));
  if (g.trainer != nullptr) g.trainer->set_step(*step);
  return *step;
}

}  // namespace tessera::checkpoint
