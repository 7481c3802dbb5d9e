// The comm-check driver: the cluster acceptance test. For every parallel group
// kind of every worker group, all executors run each collective over each size
// on exactly verifiable inputs (executor side: worker/executor/comm_check.cc);
// the driver gathers the per-rank timings and checks, and reports per group kind,
// collective and size the slowest rank's time, algorithm and bus bandwidth.
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/util.h"
#include "controller/driver/driver.h"
#include "common/parallel/layout.h"

namespace tessera::controller {
namespace {

using json = nlohmann::json;

absl::StatusOr<std::string> RunCommCheck(DriverContext& ctx) {
  const auto& cc = ctx.job.spec().comm_check();
  json table = json::array();
  int total = 0, step = 0;
  std::vector<std::pair<std::string, std::vector<std::string>>> plan;
  for (const auto& g : ctx.job.spec().groups()) {
    if (!g.colocate_with().empty()) continue;  // same executors as its target
    std::vector<std::string> kinds;
    if (cc.groups_size() > 0) kinds.assign(cc.groups().begin(), cc.groups().end());
    else for (auto k : parallel::kAllGroupKinds) kinds.push_back(parallel::GroupKindName(k));
    total += kinds.size();
    plan.emplace_back(g.name(), kinds);
  }
  for (const auto& [gname, kinds] : plan) {
    WorkerGroup& wg = *ctx.groups.at(gname);
    TESSERA_ASSIGN_OR_RETURN(auto inits, wg.InitAll());
    double init_s = 0;
    for (auto& r : inits) init_s = std::max(init_s, r.init_seconds());
    v1::Progress p0;
    p0.set_message(absl::StrCat("group '", gname, "': communicators ready in ", absl::StrFormat("%.2f", init_s), " s"));
    p0.set_step(step);
    p0.set_total_steps(total);
    ctx.progress(p0);
    for (const auto& kind : kinds) {
      if (ctx.cancelled && *ctx.cancelled) return absl::CancelledError("cancelled");
      v1::CommCheckRequest req;
      req.set_group_kind(kind);
      req.set_iters(cc.iters());
      req.set_warmup(cc.warmup());
      req.set_dtype(cc.dtype() == "bf16" ? v1::DTYPE_BF16 : cc.dtype() == "i32" ? v1::DTYPE_I32 : v1::DTYPE_F32);
      *req.mutable_sizes_bytes() = cc.sizes_bytes();
      *req.mutable_collectives() = cc.collectives();
      TESSERA_ASSIGN_OR_RETURN(auto res, wg.OneToAll(&ExecutorClient::CommCheck, req));
      // (collective, size) -> aggregate over ranks
      struct Agg { double time_us = 0, algbw = 1e30, busbw = 1e30; int groups = 0, group_size = 0; int64_t errors = 0; std::string first_error; };
      std::map<std::pair<std::string, int64_t>, Agg> agg;
      std::vector<std::pair<std::string, int64_t>> order;
      for (size_t r = 0; r < res.size(); ++r) {
        for (const v1::CommCheckResult& row : res[r].results()) {
          auto key = std::make_pair(row.collective(), row.size_bytes());
          auto [it, fresh] = agg.try_emplace(key);
          if (fresh) order.push_back(key);
          Agg& a = it->second;
          a.time_us = std::max(a.time_us, row.time_us());
          a.algbw = std::min(a.algbw, row.algbw_gbps());
          a.busbw = std::min(a.busbw, row.busbw_gbps());
          a.group_size = row.group_size();
          a.groups = std::max(a.groups, row.group_index() + 1);
          if (row.errors() > 0 && a.errors == 0) a.first_error = absl::StrCat("rank ", r, ": ", row.first_error());
          a.errors += row.errors();
        }
      }
      for (const auto& key : order) {
        const Agg& a = agg[key];
        if (a.errors > 0)
          return absl::DataLossError(absl::StrCat("comm-check failed: ", key.first, " on ", kind, " groups of group '",
                                                  gname, "' at ", FormatBytes(key.second), ": ", a.errors,
                                                  " wrong elements; ", a.first_error));
        table.push_back({{"group", gname}, {"kind", kind}, {"collective", key.first}, {"size", key.second},
                         {"groups", a.groups}, {"group_size", a.group_size}, {"time_us", a.time_us},
                         {"algbw_gbps", a.algbw}, {"busbw_gbps", a.busbw}, {"errors", 0}});
      }
      v1::Progress p;
      p.set_step(++step);
      p.set_total_steps(total);
      p.set_message(order.empty() ? absl::StrCat("group '", gname, "' ", kind, ": groups of one rank, nothing to check")
                                  : absl::StrCat("group '", gname, "' ", kind, ": ", order.size(), " checks passed"));
      for (const auto& key : order)
        if (key.first == "all_reduce" && key.second == order.back().second)
          (*p.mutable_metrics())[absl::StrCat(kind, ".", key.first, ".busbw_gbps")] = agg[key].busbw;
      ctx.progress(p);
    }
  }
  return json{{"comm_check", table}}.dump();
}

}  // namespace

absl::StatusOr<std::string> RunPretrain(DriverContext& ctx);  // driver/pretrain.cc
absl::StatusOr<std::string> RunRl(DriverContext& ctx);        // driver/rl.cc
absl::StatusOr<std::string> RunGenerate(DriverContext& ctx);  // driver/generate.cc

absl::StatusOr<DriverFn> BuiltinDriver(const std::string& kind) {
  if (kind == "comm-check") return DriverFn(RunCommCheck);
  if (kind == "pretrain" || kind == "sft") return DriverFn(RunPretrain);  // sft: loss on answers only
  if (kind == "grpo" || kind == "ppo") return DriverFn(RunRl);  // ppo: the critic rides with the actor
  if (kind == "generate") return DriverFn(RunGenerate);
  return absl::UnimplementedError(absl::StrCat("no driver for job kind '", kind, "' in this build"));
}

}  // namespace tessera::controller
