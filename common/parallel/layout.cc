#include "common/parallel/layout.h"

#include <algorithm>
#include <initializer_list>
#include <unordered_map>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tessera::parallel {

std::string Layout::ToString() const {
  return absl::StrFormat("tp=%d cp=%d dp=%d pp=%d vpp=%d sp=%d zero=%d", tp, cp, dp, pp, vpp,
                         sp ? 1 : 0, zero) +
         (last_stage_layers > 0 ? absl::StrFormat(" last_stage_layers=%d", last_stage_layers) : "") +
         (stage_layers.empty() ? "" : absl::StrCat(" stage_layers=[", absl::StrJoin(stage_layers, ","), "]"));
}

absl::Status ValidateLayout(const Layout& l, int world, const ModelShape& m) {
  auto bad = [](auto&&... args) { return absl::InvalidArgumentError(absl::StrCat(args...)); };
  if (l.tp < 1 || l.cp < 1 || l.dp < 1 || l.pp < 1 || l.vpp < 1)
    return bad("layout: tp, cp, dp, pp and vpp must each be >= 1, got ", l.ToString());
  // In 64 bits: the degrees come from the job, and their product may not fit an int.
  const int64_t product = int64_t{l.tp} * l.cp * l.dp * l.pp;
  if (world != product)
    return bad("layout: the group has ", world, " devices but tp*cp*dp*pp = ", l.tp, "*", l.cp,
               "*", l.dp, "*", l.pp, " = ", product);
  if (l.vpp > 1 && l.pp < 2)
    return bad("layout: vpp=", l.vpp, " (virtual pipeline stages) requires pp >= 2, got pp=", l.pp);
  if (l.sp && l.tp < 2) return bad("layout: sp (sequence parallel) requires tp > 1, got tp=", l.tp);
  if (l.zero < 0 || l.zero > 3) return bad("layout: zero must be 0, 1, 2 or 3, got ", l.zero);
  if (l.last_stage_layers < 0) return bad("layout: last_stage_layers must be >= 0, got ", l.last_stage_layers);
  if (l.last_stage_layers > 0 && l.pp < 2)
    return bad("layout: last_stage_layers=", l.last_stage_layers, " needs a pipeline (pp >= 2), got pp=", l.pp);
  if (!l.stage_layers.empty() && l.pp < 2)
    return bad("layout: stage_layers needs a pipeline (pp >= 2), got pp=", l.pp);
  if (!l.stage_layers.empty() && static_cast<int64_t>(l.stage_layers.size()) != int64_t{l.pp} * l.vpp)
    return bad("layout: stage_layers has ", l.stage_layers.size(), " entries; expected one per virtual stage, pp*vpp = ",
               l.pp, "*", l.vpp, " = ", l.pp * l.vpp);
  if (m.num_layers > 0) {
    if (auto st = CheckLayerSplit(m.num_layers, l.pp, l.vpp, l.last_stage_layers, l.stage_layers); !st.ok()) return st;
  }
  if (m.global_batch > 0) {
    const int64_t mb = m.micro_batch > 0 ? m.micro_batch : 1;
    if (m.global_batch % (l.dp * mb) != 0)
      return bad("model.global_batch=", m.global_batch, " is not divisible by dp*micro_batch = ",
                 l.dp, "*", mb, " = ", l.dp * mb);
  }
  if (m.num_heads > 0 && m.num_heads % l.tp != 0)
    return bad("model.num_heads=", m.num_heads, " is not divisible by tp=", l.tp);
  if (m.num_kv_heads > 0 && m.num_kv_heads % l.tp != 0 && l.tp % m.num_kv_heads != 0)
    return bad("model.num_kv_heads=", m.num_kv_heads, " must be divisible by tp=", l.tp,
               " (or divide it, so that KV heads are replicated)");
  if (m.seq_len > 0) {
    if (l.sp && m.seq_len % l.tp != 0)
      return bad("model.seq_len=", m.seq_len, " is not divisible by tp=", l.tp,
                 " (required by sequence parallelism)");
    if (l.cp > 1 && m.seq_len % (2 * l.cp) != 0)
      return bad("model.seq_len=", m.seq_len, " is not divisible by 2*cp = ", 2 * l.cp,
                 " (load-balanced causal context parallelism)");
  }
  // vocab_size is padded up to a multiple of tp by the model; nothing to reject.
  return absl::OkStatus();
}

Coords CoordsOf(const Layout& l, int rank) {
  Coords c;
  c.tp = rank % l.tp;
  rank /= l.tp;
  c.cp = rank % l.cp;
  rank /= l.cp;
  c.dp = rank % l.dp;
  rank /= l.dp;
  c.pp = rank;
  return c;
}

int RankOf(const Layout& l, const Coords& c) {
  return c.tp + l.tp * (c.cp + l.cp * (c.dp + l.dp * c.pp));
}

const char* GroupKindName(GroupKind kind) {
  switch (kind) {
    case GroupKind::kTp: return "tp";
    case GroupKind::kCp: return "cp";
    case GroupKind::kDp: return "dp";
    case GroupKind::kPp: return "pp";
    case GroupKind::kDpCp: return "dp_cp";
    case GroupKind::kMp: return "mp";
    case GroupKind::kEmbedding: return "embedding";
    case GroupKind::kWorld: return "world";
  }
  return "?";
}

absl::StatusOr<GroupKind> ParseGroupKind(const std::string& name) {
  for (GroupKind k : kAllGroupKinds)
    if (name == GroupKindName(k)) return k;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown group '", name, "'; expected one of tp, cp, dp, pp, dp_cp, mp, embedding, world"));
}

namespace {
// Key identifying the group of `kind` that rank `c` belongs to: the coordinates that
// stay fixed within the group, as one number (each below `base`).
int64_t GroupKey(GroupKind kind, const Coords& c, int64_t base) {
  auto key = [base](std::initializer_list<int> fixed) {
    int64_t k = 0;
    for (int v : fixed) k = k * base + v;
    return k;
  };
  switch (kind) {
    case GroupKind::kTp: return key({c.cp, c.dp, c.pp});
    case GroupKind::kCp: return key({c.tp, c.dp, c.pp});
    case GroupKind::kDp: return key({c.tp, c.cp, c.pp});
    case GroupKind::kPp: return key({c.tp, c.cp, c.dp});
    case GroupKind::kDpCp: return key({c.tp, c.pp});
    case GroupKind::kMp: return key({c.cp, c.dp});
    case GroupKind::kEmbedding: return key({c.tp, c.cp, c.dp});
    case GroupKind::kWorld: return 0;
  }
  return 0;
}
}  // namespace

std::vector<std::vector<int>> BuildGroups(const Layout& l, GroupKind kind) {
  // Keys hashed: linear in the world, which reaches 65536 ranks.
  const int64_t base = static_cast<int64_t>(l.world()) + 1;
  std::unordered_map<int64_t, size_t> slot;  // key -> its group, in order of first (smallest) rank
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < l.world(); ++r) {
    Coords c = CoordsOf(l, r);
    if (kind == GroupKind::kEmbedding && c.pp != 0 && c.pp != l.pp - 1) continue;
    auto [it, inserted] = slot.try_emplace(GroupKey(kind, c, base), groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back(r);
  }
  return groups;
}

GroupMembership GroupOf(const Layout& l, GroupKind kind, int rank) {
  auto groups = BuildGroups(l, kind);
  GroupMembership m;
  for (size_t g = 0; g < groups.size(); ++g) {
    auto it = std::find(groups[g].begin(), groups[g].end(), rank);
    if (it != groups[g].end()) {
      m.ranks = groups[g];
      m.index = static_cast<int>(g);
      m.rank_in_group = static_cast<int>(it - groups[g].begin());
      return m;
    }
  }
  return m;
}

std::vector<std::pair<int, int>> LayersOfRank(const Layout& l, int num_layers, int pp_rank) {
  std::vector<std::pair<int, int>> out;
  for (int chunk = 0; chunk < l.vpp; ++chunk) {
    auto [b, e] = VirtualStageLayers(num_layers, l.pp * l.vpp, l.last_stage_layers, l.stage_layers, chunk * l.pp + pp_rank);
    out.emplace_back(static_cast<int>(b), static_cast<int>(e));
  }
  return out;
}

absl::Status CheckLayerSplit(int64_t num_layers, int pp, int vpp, int64_t last_stage_layers,
                             const std::vector<int>& stage_layers) {
  const int stages = pp * vpp;
  if (!stage_layers.empty()) {
    auto bad = [](auto&&... args) { return absl::InvalidArgumentError(absl::StrCat(args...)); };
    if (last_stage_layers > 0)
      return bad("layout: set stage_layers or last_stage_layers, not both (stage_layers gives every virtual stage's)");
    if (static_cast<int>(stage_layers.size()) != stages)
      return bad("layout: stage_layers has ", stage_layers.size(), " entries; expected one per virtual stage, pp*vpp = ",
                 pp, "*", vpp, " = ", stages);
    int64_t sum = 0;
    for (size_t v = 0; v < stage_layers.size(); ++v) {
      if (stage_layers[v] < 0) return bad("layout: stage_layers[", v, "] = ", stage_layers[v], "; must be >= 0");
      sum += stage_layers[v];
    }
    if (sum != num_layers)
      return bad("layout: stage_layers [", absl::StrJoin(stage_layers, ", "), "] sum to ", sum,
                 " layers; model.num_layers=", num_layers);
    return absl::OkStatus();
  }
  if (last_stage_layers > 0 && num_layers - last_stage_layers < stages - 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "layout: last_stage_layers=", last_stage_layers, " leaves ", num_layers - last_stage_layers,
        " of model.num_layers=", num_layers, " for the other ", stages - 1,
        " virtual stages (pp*vpp - 1); each needs at least one"));
  if (last_stage_layers <= 0 && num_layers % stages != 0)
    return absl::InvalidArgumentError(absl::StrCat("model.num_layers=", num_layers, " is not divisible by pp*vpp = ", pp,
                                                   "*", vpp, " = ", stages,
                                                   " (or set layout.last_stage_layers for an uneven split)"));
  return absl::OkStatus();
}

std::pair<int64_t, int64_t> VirtualStageLayers(int64_t num_layers, int stages, int64_t last_stage_layers,
                                               const std::vector<int>& stage_layers, int v) {
  if (stages <= 1) return {0, num_layers};
  if (!stage_layers.empty()) {
    int64_t begin = 0;
    for (int u = 0; u < v && u < static_cast<int>(stage_layers.size()); ++u) begin += stage_layers[u];
    return {begin, begin + (v < static_cast<int>(stage_layers.size()) ? stage_layers[v] : 0)};
  }
  if (last_stage_layers <= 0) {
    const int64_t per = num_layers / stages;
    return {v * per, (v + 1) * per};
  }
  if (v == stages - 1) return {num_layers - last_stage_layers, num_layers};
  const int64_t rest = num_layers - last_stage_layers, others = stages - 1, per = rest / others, extra = rest % others;
  const int64_t begin = v * per + std::min<int64_t>(v, extra);
  return {begin, begin + per + (v < extra ? 1 : 0)};
}

StageCosts LlamaStageCosts(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t ffn,
                           int64_t vocab, int64_t seq_len) {
  const double h = hidden, d = head_dim;
  const double matmul = h * (heads + 2.0 * kv_heads) * d + heads * d * h + 3.0 * h * ffn;
  return StageCosts{6.0 * matmul + 6.0 * heads * d * seq_len, 6.0 * h * vocab};
}

std::vector<int> BalancedStageLayers(int64_t num_layers, int pp, int vpp, const StageCosts& costs) {
  const int stages = pp * vpp;
  std::vector<double> load(pp, 0.0);
  load[(stages - 1) % pp] = costs.head;
  std::vector<int> rank_layers(pp, 0);
  for (int64_t k = 0; k < num_layers; ++k) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    ++rank_layers[r], load[r] += costs.layer;
  }
  std::vector<int> out(stages, 0);
  for (int r = 0; r < pp; ++r)
    for (int k = 0; k < rank_layers[r]; ++k) {
      int best = -1;
      double least = 0;
      for (int v = r; v < stages; v += pp) {
        const double at = out[v] * costs.layer + (v == stages - 1 ? costs.head : 0.0);
        if (best < 0 || at < least) best = v, least = at;
      }
      ++out[best];
    }
  return out;
}

}  // namespace tessera::parallel
