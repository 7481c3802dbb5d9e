#include "common/rl.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::rl {

absl::StatusOr<std::vector<double>> GroupNormalizedAdvantages(const std::vector<double>& rewards,
                                                              const GroupAdvantageOptions& o) {
  const int64_t n = static_cast<int64_t>(rewards.size()), g = o.group_size;
  if (g < 2)
    return absl::InvalidArgumentError(absl::StrCat("group_size: ", g, ", expected at least 2 samples per prompt"));
  if (n % g != 0)
    return absl::InvalidArgumentError(absl::StrCat("rewards: ", n, " values do not split into groups of ", g));
  if (o.eps < 0) return absl::InvalidArgumentError(absl::StrCat("eps: ", o.eps, ", expected >= 0"));
  std::vector<double> adv(n);
  for (int64_t b = 0; b < n; b += g) {
    double mean = 0;
    for (int64_t i = b; i < b + g; ++i) mean += rewards[i];
    mean /= g;
    double var = 0;
    for (int64_t i = b; i < b + g; ++i) var += (rewards[i] - mean) * (rewards[i] - mean);
    // An all-equal group carries no signal: its advantages are 0 (also with eps = 0).
    const double denom = std::sqrt(var / (g - 1)) + o.eps;
    const double scale = !o.scale_by_std ? 1.0 : denom > 0 ? 1.0 / denom : 0.0;
    for (int64_t i = b; i < b + g; ++i) adv[i] = (rewards[i] - mean) * scale;
  }
  return adv;
}

absl::StatusOr<Gae> ComputeGae(const std::vector<double>& rewards, const std::vector<double>& values, double gamma,
                               double lambda, double last_value) {
  if (rewards.size() != values.size())
    return absl::InvalidArgumentError(
        absl::StrCat("values: ", values.size(), " for ", rewards.size(), " rewards, expected one per token"));
  if (gamma < 0 || gamma > 1) return absl::InvalidArgumentError(absl::StrCat("gamma: ", gamma, ", expected in [0, 1]"));
  if (lambda < 0 || lambda > 1)
    return absl::InvalidArgumentError(absl::StrCat("lambda: ", lambda, ", expected in [0, 1]"));
  const size_t n = rewards.size();
  Gae out{std::vector<double>(n), std::vector<double>(n)};
  double next_value = last_value, next_adv = 0;
  for (size_t t = n; t-- > 0;) {
    const double delta = rewards[t] + gamma * next_value - values[t];
    next_adv = delta + gamma * lambda * next_adv;
    out.advantages[t] = next_adv;
    out.returns[t] = next_adv + values[t];
    next_value = values[t];
  }
  return out;
}

absl::StatusOr<PpoAdvantages> ComputePpoAdvantages(const std::vector<PpoResponse>& responses, const PpoAdvantageOptions& o) {
  if (o.kl_reward_coef < 0) return absl::InvalidArgumentError(absl::StrCat("kl_reward_coef: ", o.kl_reward_coef, " < 0"));
  PpoAdvantages out;
  double kl_sum = 0, kl_n = 0;
  for (size_t i = 0; i < responses.size(); ++i) {
    const PpoResponse& r = responses[i];
    const size_t n = r.values.size();
    if (o.kl_reward_coef > 0 && (r.old_logp.size() != n || r.ref_logp.size() != n))
      return absl::InvalidArgumentError(absl::StrCat("responses[", i, "]: ", r.old_logp.size(), " old and ", r.ref_logp.size(),
                                                     " reference log-probs for ", n, " values"));
    std::vector<double> rewards(n, 0.0);
    if (o.kl_reward_coef > 0)
      for (size_t t = 0; t < n; ++t) {
        const double kl = Kl(o.kl_reward, r.old_logp[t], r.ref_logp[t]);
        rewards[t] -= o.kl_reward_coef * kl;
        kl_sum += kl, kl_n += 1;
      }
    if (n > 0) rewards.back() += r.reward;
    TESSERA_ASSIGN_OR_RETURN(Gae g, ComputeGae(rewards, r.values, o.gamma, o.lambda));
    out.advantages.push_back(std::move(g.advantages));
    out.returns.push_back(std::move(g.returns));
  }
  out.reward_kl = kl_n > 0 ? kl_sum / kl_n : 0.0;
  if (!o.whiten) return out;
  double n = 0, mean = 0, sq = 0;
  for (const auto& a : out.advantages)
    for (double v : a) n += 1, mean += v;
  if (n < 2) return out;
  mean /= n;
  for (const auto& a : out.advantages)
    for (double v : a) sq += (v - mean) * (v - mean);
  const double inv = 1.0 / std::sqrt(sq / (n - 1) + 1e-8);
  for (auto& a : out.advantages)
    for (double& v : a) v = (v - mean) * inv;
  return out;
}

double Kl(KlEstimator k, double logp, double ref_logp) {
  const double d = logp - ref_logp;
  switch (k) {
    case KlEstimator::kK1: return d;
    case KlEstimator::kK2: return 0.5 * d * d;
    case KlEstimator::kK3: return std::exp(-d) + d - 1;  // exp(ref - logp) - (ref - logp) - 1
    case KlEstimator::kLowVarK3: {
      const double c = std::clamp(-d, -20.0, 20.0);  // ref - logp
      return std::clamp(std::exp(c) - c - 1, -10.0, 10.0);
    }
  }
  return 0;
}

double KlGrad(KlEstimator k, double logp, double ref_logp) {
  const double d = logp - ref_logp;
  switch (k) {
    case KlEstimator::kK1: return 1;
    case KlEstimator::kK2: return d;
    case KlEstimator::kK3: return 1 - std::exp(-d);
    case KlEstimator::kLowVarK3:
      if (std::abs(d) > 20 || std::exp(-d) + d - 1 > 10) return 0;  // a clamp bites: constant there
      return 1 - std::exp(-d);
  }
  return 0;
}

namespace {
// "seq-mean-token-sum" and "seq_mean_token_sum" alike.
std::string Underscored(std::string_view name) {
  std::string s(name);
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}
}  // namespace

absl::StatusOr<KlEstimator> ParseKlEstimator(std::string_view name) {
  const std::string s = Underscored(name);
  if (s == "k1") return KlEstimator::kK1;
  if (s == "k2") return KlEstimator::kK2;
  if (s == "k3") return KlEstimator::kK3;
  if (s == "low_var_kl") return KlEstimator::kLowVarK3;
  return absl::InvalidArgumentError(absl::StrCat("'", std::string(name), "': expected k1, k2, k3 or low_var_kl"));
}

const char* KlEstimatorName(KlEstimator k) {
  switch (k) {
    case KlEstimator::kK1: return "k1";
    case KlEstimator::kK2: return "k2";
    case KlEstimator::kK3: return "k3";
    case KlEstimator::kLowVarK3: return "low_var_kl";
  }
  return "?";
}

absl::StatusOr<AdvantageEstimator> ParseAdvantageEstimator(std::string_view name) {
  const std::string s = Underscored(name);
  if (s == "grpo") return AdvantageEstimator::kGrpo;
  if (s == "rloo") return AdvantageEstimator::kRloo;
  if (s == "reinforce_plus_plus") return AdvantageEstimator::kReinforcePlusPlus;
  if (s == "gae") return AdvantageEstimator::kGae;
  return absl::InvalidArgumentError(absl::StrCat("'", std::string(name), "': expected grpo, rloo, reinforce_plus_plus or gae"));
}

absl::StatusOr<OutcomeAdvantages> ComputeOutcomeAdvantages(const std::vector<OutcomeResponse>& responses,
                                                           const OutcomeAdvantageOptions& o) {
  if (o.kl_reward_coef < 0) return absl::InvalidArgumentError(absl::StrCat("kl_reward_coef: ", o.kl_reward_coef, " < 0"));
  if (o.gamma < 0 || o.gamma > 1) return absl::InvalidArgumentError(absl::StrCat("gamma: ", o.gamma, ", expected in [0, 1]"));
  const size_t n = responses.size();
  // Each response's token rewards: the KL penalty on every token, the outcome on the last.
  std::vector<std::vector<double>> token_rewards(n);
  double kl_sum = 0, kl_n = 0;
  for (size_t i = 0; i < n; ++i) {
    const OutcomeResponse& r = responses[i];
    std::vector<double>& tr = token_rewards[i];
    tr.assign(r.tokens, 0.0);
    if (o.kl_reward_coef > 0) {
      if (r.old_logp.size() != r.tokens || r.ref_logp.size() != r.tokens)
        return absl::InvalidArgumentError(absl::StrCat("responses[", i, "]: ", r.old_logp.size(), " old and ", r.ref_logp.size(),
                                                       " reference log-probs for ", r.tokens, " tokens"));
      for (size_t t = 0; t < r.tokens; ++t) {
        const double kl = Kl(o.kl_reward, r.old_logp[t], r.ref_logp[t]);
        tr[t] -= o.kl_reward_coef * kl;
        kl_sum += kl, kl_n += 1;
      }
    }
    if (r.tokens > 0) tr.back() += r.reward;
  }
  OutcomeAdvantages out;
  out.reward_kl = kl_n > 0 ? kl_sum / kl_n : 0.0;
  out.advantages.resize(n);
  switch (o.estimator) {
    case AdvantageEstimator::kGae:
      return absl::InvalidArgumentError("estimator: gae needs a critic's values (ComputePpoAdvantages)");
    case AdvantageEstimator::kGrpo:
    case AdvantageEstimator::kRloo: {
      // The score of a response without tokens is its outcome alone.
      std::vector<double> scores(n);
      for (size_t i = 0; i < n; ++i) {
        scores[i] = responses[i].tokens == 0 ? responses[i].reward : 0.0;
        for (double v : token_rewards[i]) scores[i] += v;
      }
      std::vector<double> adv(n);
      if (o.estimator == AdvantageEstimator::kGrpo) {
        TESSERA_ASSIGN_OR_RETURN(adv, GroupNormalizedAdvantages(scores, {o.group_size, o.scale_by_std, o.eps}));
      } else {
        const int64_t g = o.group_size;
        if (g < 2) return absl::InvalidArgumentError(absl::StrCat("group_size: ", g, ", expected at least 2 samples per prompt"));
        if (static_cast<int64_t>(n) % g != 0)
          return absl::InvalidArgumentError(absl::StrCat("rewards: ", n, " values do not split into groups of ", g));
        for (size_t b = 0; b < n; b += g) {
          double sum = 0;
          for (size_t i = b; i < b + g; ++i) sum += scores[i];
          for (size_t i = b; i < b + g; ++i) adv[i] = scores[i] - (sum - scores[i]) / static_cast<double>(g - 1);
        }
      }
      for (size_t i = 0; i < n; ++i) out.advantages[i].assign(responses[i].tokens, adv[i]);
      return out;
    }
    case AdvantageEstimator::kReinforcePlusPlus: {
      double count = 0, mean = 0, sq = 0;
      for (size_t i = 0; i < n; ++i) {
        std::vector<double>& a = out.advantages[i];
        a.assign(token_rewards[i].size(), 0.0);
        double ret = 0;
        for (size_t t = a.size(); t-- > 0;) a[t] = ret = token_rewards[i][t] + o.gamma * ret;
        for (double v : a) count += 1, mean += v;
      }
      if (count < 2) return out;  // (as ComputePpoAdvantages: too few tokens to whiten)
      mean /= count;
      for (const auto& a : out.advantages)
        for (double v : a) sq += (v - mean) * (v - mean);
      const double inv = 1.0 / std::sqrt(sq / (count - 1) + 1e-8);
      for (auto& a : out.advantages)
        for (double& v : a) v = (v - mean) * inv;
      return out;
    }
  }
  return out;
}

double TisWeight(double old_logp, double rollout_logp, double cap) { return std::min(std::exp(old_logp - rollout_logp), cap); }

double OverlongPenalty(int64_t length, const OverlongOptions& o) {
  if (o.buffer <= 0 || o.factor <= 0) return 0;
  const int64_t over = length - (o.max_length - o.buffer);
  if (over <= 0) return 0;
  return -o.factor * std::min<double>(1.0, static_cast<double>(over) / static_cast<double>(o.buffer));
}

absl::StatusOr<LossAggregation> ParseLossAggregation(std::string_view name) {
  const std::string s = Underscored(name);
  if (s == "token_mean") return LossAggregation::kTokenMean;
  if (s == "seq_mean_token_sum") return LossAggregation::kSeqMeanTokenSum;
  if (s == "seq_mean_token_mean") return LossAggregation::kSeqMeanTokenMean;
  if (s == "seq_mean_token_sum_norm") return LossAggregation::kSeqMeanTokenSumNorm;
  return absl::InvalidArgumentError(absl::StrCat(
      "'", std::string(name), "': expected token_mean, seq_mean_token_sum, seq_mean_token_mean or seq_mean_token_sum_norm"));
}

absl::StatusOr<LossWeights> ComputeLossWeights(const std::vector<double>& mask, const std::vector<int32_t>& cu_seqlens,
                                               LossAggregation a, double norm_length) {
  const int64_t n = static_cast<int64_t>(mask.size());
  if (cu_seqlens.size() < 2 || cu_seqlens.front() != 0 || cu_seqlens.back() != n)
    return absl::InvalidArgumentError(absl::StrCat("cu_seqlens: expected boundaries 0 ... ", n));
  if (a == LossAggregation::kSeqMeanTokenSumNorm && !(norm_length > 0))
    return absl::InvalidArgumentError(absl::StrCat("norm_length: ", norm_length, ", expected > 0"));
  LossWeights out;
  out.weight = mask;
  for (size_t j = 0; j + 1 < cu_seqlens.size(); ++j) {
    const int32_t b = cu_seqlens[j], e = cu_seqlens[j + 1];
    if (b > e) return absl::InvalidArgumentError(absl::StrCat("cu_seqlens[", j, "]: ", b, " > ", e));
    double counted = 0;
    for (int32_t t = b; t < e; ++t) {
      if (mask[t] < 0) return absl::InvalidArgumentError(absl::StrCat("mask: ", mask[t], ", expected >= 0"));
      counted += mask[t];
    }
    if (counted == 0) continue;
    switch (a) {
      case LossAggregation::kTokenMean: out.units += counted; break;
      case LossAggregation::kSeqMeanTokenSum: out.units += 1; break;
      case LossAggregation::kSeqMeanTokenMean:
        out.units += 1;
        for (int32_t t = b; t < e; ++t) out.weight[t] /= counted;
        break;
      case LossAggregation::kSeqMeanTokenSumNorm: out.units += norm_length; break;
    }
  }
  return out;
}

namespace {

absl::Status CheckTokens(const PolicyTokens& in, const PolicyLossOptions& o) {
  const size_t n = in.logp.size();
  auto same = [&](const std::vector<double>& v, const char* name) -> absl::Status {
    if (v.size() != n)
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", v.size(), " values for ", n, " tokens"));
    return absl::OkStatus();
  };
  for (auto [v, name] : {std::pair{&in.old_logp, "old_logp"}, {&in.advantage, "advantage"}, {&in.mask, "mask"}})
    if (absl::Status s = same(*v, name); !s.ok()) return s;
  if (o.kl_coef > 0)
    if (absl::Status s = same(in.ref_logp, "ref_logp (kl_coef > 0)"); !s.ok()) return s;
  if (!in.is_weight.empty())
    if (absl::Status s = same(in.is_weight, "is_weight"); !s.ok()) return s;
  if (o.entropy_coef > 0)
    if (absl::Status s = same(in.entropy, "entropy (entropy_coef > 0)"); !s.ok()) return s;
  if (o.clip_low < 0 || o.clip_low >= 1 || o.clip_high < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("clip_low / clip_high: ", o.clip_low, " / ", o.clip_high, ", expected 0 <= low < 1 and high >= 0"));
  if (o.kl_coef < 0 || o.entropy_coef < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("kl_coef / entropy_coef: ", o.kl_coef, " / ", o.entropy_coef, ", expected >= 0"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PolicyLoss> ComputePolicyLoss(const PolicyTokens& in, const PolicyLossOptions& o) {
  if (absl::Status s = CheckTokens(in, o); !s.ok()) return s;
  const size_t n = in.logp.size();
  double count = 0;
  for (double m : in.mask) count += m;
  PolicyLoss out;
  out.dlogp.assign(n, 0.0);
  if (o.entropy_coef > 0) out.dentropy.assign(n, 0.0);
  if (count <= 0) return out;  // nothing counts: zero loss, zero gradients
  const bool dual = o.dual_clip > 1;
  double pg_sum = 0, kl_sum = 0, ent_sum = 0, clipped = 0;
  for (size_t t = 0; t < n; ++t) {
    const double m = in.mask[t];
    if (m == 0) continue;
    const double a = in.advantage[t], ratio = std::exp(in.logp[t] - in.old_logp[t]);
    const double bounded = std::clamp(ratio, 1 - o.clip_low, 1 + o.clip_high);
    double pg = -a * ratio, dpg = -a * ratio;  // d(-a ratio)/d logp = -a ratio
    if (-a * bounded > pg) {                   // the clipped side is the larger: no gradient
      pg = -a * bounded, dpg = 0;
      clipped += m;
    }
    if (dual && a < 0 && pg > -o.dual_clip * a) pg = -o.dual_clip * a, dpg = 0;
    if (!in.is_weight.empty()) pg *= in.is_weight[t], dpg *= in.is_weight[t];
    pg_sum += m * pg;
    out.dlogp[t] = m * dpg;
    if (o.kl_coef > 0) {
      kl_sum += m * Kl(o.kl, in.logp[t], in.ref_logp[t]);
      out.dlogp[t] += m * o.kl_coef * KlGrad(o.kl, in.logp[t], in.ref_logp[t]);
    }
    if (o.entropy_coef > 0) {
      ent_sum += m * in.entropy[t];
      out.dentropy[t] = -m * o.entropy_coef / count;
    }
    out.dlogp[t] /= count;
  }
  out.pg_loss = pg_sum / count;
  out.kl = kl_sum / count;
  out.entropy = ent_sum / count;
  out.clip_fraction = clipped / count;
  out.loss = out.pg_loss + o.kl_coef * out.kl - o.entropy_coef * out.entropy;
  return out;
}

absl::StatusOr<ValueLoss> ComputeValueLoss(const ValueTokens& in, double clip) {
  const size_t n = in.value.size();
  for (auto [name, v] : {std::pair{"old_value", &in.old_value}, std::pair{"returns", &in.returns},
                         std::pair{"mask", &in.mask}})
    if (v->size() != n)
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", v->size(), " values for ", n, " tokens"));
  double counted = 0;
  for (double m : in.mask) {
    if (m < 0) return absl::InvalidArgumentError(absl::StrCat("mask: ", m, ", expected >= 0"));
    counted += m;
  }
  ValueLoss out;
  out.dvalue.assign(n, 0.0);
  if (counted == 0) return out;  // nothing counted: no loss, no gradient
  for (size_t t = 0; t < n; ++t) {
    if (in.mask[t] == 0) continue;
    const double v = in.value[t], r = in.returns[t];
    const double unclipped = 0.5 * (v - r) * (v - r);
    double loss = unclipped, grad = v - r;
    if (clip > 0) {
      const double vc = in.old_value[t] + std::clamp(v - in.old_value[t], -clip, clip);
      const double clipped = 0.5 * (vc - r) * (vc - r);
      if (clipped > unclipped) {
        loss = clipped;
        // d vc / d v is 1 inside the clip range, 0 outside it.
        const bool inside = std::abs(v - in.old_value[t]) < clip;
        grad = inside ? vc - r : 0.0;
        out.clip_fraction += in.mask[t];
      }
    }
    out.loss += in.mask[t] * loss / counted;
    out.dvalue[t] = in.mask[t] * grad / counted;
  }
  out.clip_fraction /= counted;
  return out;
}

namespace {

// The content of the last \boxed{...} whose braces close, if any.
std::optional<std::string_view> LastBoxed(std::string_view s) {
  for (size_t at = s.rfind("\\boxed"); at != std::string_view::npos; at = at == 0 ? std::string_view::npos : s.rfind("\\boxed", at - 1)) {
    size_t i = at + 6;
    while (i < s.size() && s[i] == ' ') ++i;
    if (i >= s.size() || s[i] != '{') continue;
    int depth = 1;
    size_t j = i + 1;
    for (; j < s.size() && depth > 0; ++j) depth += s[j] == '{' ? 1 : s[j] == '}' ? -1 : 0;
    if (depth == 0) return s.substr(i + 1, j - 1 - (i + 1));
  }
  return std::nullopt;
}

// A math answer as it compares: without $...$ around it, spaces and thin spaces.
std::string AnswerKey(std::string_view a) {
  std::string s(absl::StripAsciiWhitespace(absl::string_view(a.data(), a.size())));
  while (s.size() >= 2 && s.front() == '$' && s.back() == '$') s = s.substr(1, s.size() - 2);
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == ',' || s[i + 1] == '!' || s[i + 1] == ';' || s[i + 1] == ' ')) {
      ++i;
      continue;
    }
    if (!absl::ascii_isspace(static_cast<unsigned char>(s[i]))) out += s[i];
  }
  return out;
}

// The number a key spells (digits with optional thousands commas, a sign, a fraction
// part, an exponent), if it is one.
std::optional<double> AsNumber(const std::string& key) {
  std::string plain;
  for (size_t i = 0; i < key.size(); ++i) {
    const bool between_digits = key[i] == ',' && i > 0 && i + 1 < key.size() && absl::ascii_isdigit(key[i - 1]) &&
                                absl::ascii_isdigit(key[i + 1]);
    if (!between_digits) plain += key[i];
  }
  if (plain.empty() || !(absl::ascii_isdigit(plain[0]) || plain[0] == '-' || plain[0] == '+' || plain[0] == '.')) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(plain.c_str(), &end);
  if (end != plain.c_str() + plain.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace

std::string FinalAnswer(std::string_view completion) {
  if (const auto boxed = LastBoxed(completion)) {
    completion = *boxed;
  } else if (const size_t mark = completion.rfind("####"); mark != std::string_view::npos) {
    completion.remove_prefix(mark + 4);
  }
  return std::string(absl::StripAsciiWhitespace(absl::string_view(completion.data(), completion.size())));
}

bool SameAnswer(std::string_view a, std::string_view b) {
  const std::string ka = AnswerKey(a), kb = AnswerKey(b);
  if (ka == kb) return true;
  const auto na = AsNumber(ka), nb = AsNumber(kb);
  return na && nb && std::abs(*na - *nb) <= 1e-9 * std::max(1.0, std::abs(*nb));
}

double ExactAnswerReward(std::string_view completion, std::string_view answer) {
  return SameAnswer(FinalAnswer(completion), FinalAnswer(answer)) ? 1.0 : 0.0;
}

}  // namespace tessera::rl
