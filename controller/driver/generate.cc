// The generate driver (batch inference): every executor of the one group generates its DP
// rank's share of generate.input; DP rank 0 joins the parts into generate.output
// (worker/executor/generate.h). The driver reports the totals: prompts, completions,
// new tokens, tokens/s (over the slowest rank's time) and the output path.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "controller/driver/driver.h"

namespace tessera::controller {

using json = nlohmann::json;

absl::StatusOr<std::string> RunGenerate(DriverContext& ctx) {
  const auto& spec = ctx.job.spec();
  WorkerGroup& wg = *ctx.groups.at(spec.groups(0).name());
  TESSERA_ASSIGN_OR_RETURN(auto inits, wg.InitAll());
  v1::Progress ready;
  ready.set_total_steps(1);
  ready.set_message(absl::StrCat("group '", spec.groups(0).name(), "': ", inits.size(), " ranks generating from ",
                                 spec.generate().input()));
  ctx.progress(ready);
  TESSERA_ASSIGN_OR_RETURN(auto res, wg.OneToAll(&ExecutorClient::Generate, v1::GenerateRequest{}));
  const int tp = std::max(1, spec.groups(0).layout().tp());
  int64_t prompts = 0, completions = 0, tokens = 0;
  double seconds = 0;
  std::string output;
  for (size_t r = 0; r < res.size(); ++r) {
    seconds = std::max(seconds, res[r].seconds());
    if (!res[r].output().empty()) output = res[r].output();
    if (r % tp != 0) continue;  // TP peers generated the same sequences
    prompts += res[r].prompts(), completions += res[r].completions(), tokens += res[r].tokens();
  }
  if (output.empty()) return absl::InternalError("generate: no rank reports writing the output");
  v1::Progress p;
  p.set_step(1);
  p.set_total_steps(1);
  p.set_message(absl::StrFormat("%d prompts, %d completions, %d tokens -> %s", prompts, completions, tokens, output));
  auto& m = *p.mutable_metrics();
  m["prompts"] = static_cast<double>(prompts), m["completions"] = static_cast<double>(completions);
  m["tokens"] = static_cast<double>(tokens), m["seconds"] = seconds;
  if (seconds > 0) m["tokens_per_s"] = tokens / seconds;
  ctx.progress(p);
  return json{{"prompts", prompts}, {"completions", completions}, {"tokens", tokens}, {"seconds", seconds},
              {"output", output}}
      .dump();
}

}  // namespace tessera::controller
