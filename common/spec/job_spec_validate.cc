// Normalizing and validating a parsed job spec (common/spec/job_spec.h): defaults, every rule
// that needs no cluster knowledge, `stage_layers: auto`, path roots.
#include <limits.h>
#include <stdlib.h>

#include <set>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/rl.h"
#include "common/spec/job_spec.h"
#include "common/spec/job_spec_internal.h"
#include "common/spec/job_spec_limits.h"
#include "common/status.h"
#include "common/util.h"
#include "common/parallel/layout.h"

namespace tessera {
namespace {
using job_spec_internal::Bad;
using v1::JobSpec;

// Each stop string is one byte: one token of the byte tokenizer.
absl::Status CheckStops(absl::string_view field, const google::protobuf::RepeatedPtrField<std::string>& stops) {
  for (int i = 0; i < stops.size(); ++i) {
    const absl::string_view stop = stops.Get(i);
    if (stop.size() != 1)
      return Bad(absl::StrCat(field, "[", i, "]"), absl::StrCat("'", stop, "' is ", stop.size(),
                                                                " bytes; stop strings are one byte (one token of the byte tokenizer)"));
  }
  return absl::OkStatus();
}

}  // namespace

const v1::GroupSpec* GroupWithRole(const v1::JobSpec& spec, absl::string_view role) {
  if (spec.kind() != "grpo" && spec.kind() != "ppo") return nullptr;
  for (int i = 1; i < spec.groups_size(); ++i)
    if (spec.groups(i).role() == role) return &spec.groups(i);
  return nullptr;
}

const v1::GroupSpec* RolloutPool(const v1::JobSpec& spec) { return GroupWithRole(spec, "rollout"); }

std::string DevicesOf(const v1::JobSpec& spec, const std::string& group) {
  for (const auto& g : spec.groups())
    if (g.name() == group) return g.colocate_with().empty() ? g.name() : g.colocate_with();
  return group;
}

bool IsRunnableKind(absl::string_view kind) {
  return kind == "comm-check" || kind == "pretrain" || kind == "sft" || kind == "grpo" || kind == "ppo" ||
         kind == "generate";
}

namespace {
// Job names become job ids (name-hex), which name directories and log files.
bool ValidName(const std::string& s) { return IsSafeName(s, 63); }
}  // namespace

// A path in a job spec: absolute, no '.' or '..' components (so that the check against
// the controller's roots is a plain prefix test).
static absl::Status CheckCleanAbsolute(const std::string& field, const std::string& path) {
  if (path.empty() || path[0] != '/') return Bad(field, absl::StrCat("must be an absolute path, got '", path, "'"));
  for (absl::string_view part : absl::StrSplit(path, '/'))
    if (part == "." || part == "..") return Bad(field, absl::StrCat("must not contain '.' or '..' components: '", path, "'"));
  return absl::OkStatus();
}

// pretrain / sft: one worker group training a Llama on built-in data (byte tokens; sft
// takes the loss on the answers only).
static absl::Status ValidatePretrain(JobSpec& spec) {
  const bool rl = spec.kind() == "grpo" || spec.kind() == "ppo";
  if (spec.groups_size() != 1 && !(rl && spec.groups_size() <= 5))
    return Bad("groups", absl::StrCat("a ", spec.kind(), " job has exactly one worker group",
                                      rl ? " (or up to five: the actor, then a rollout, a reference, a critic and a reward group)"
                                         : ""));
  const auto& l = spec.groups(0).layout();
  const auto& m = spec.model();
  struct Req {
    const char* name;
    int64_t value;
  };
  // With hf_dir the model's dims come from its config.json (read by the executors).
  const bool hf = !m.hf_dir().empty();
  if (hf) {
    TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute("model.hf_dir", m.hf_dir()));
    for (Req r : {Req{"hidden", m.hidden()}, Req{"num_layers", m.num_layers()}, Req{"num_heads", m.num_heads()},
                  Req{"num_kv_heads", m.num_kv_heads()}, Req{"vocab_size", m.vocab_size()}, Req{"ffn", m.ffn()},
                  Req{"head_dim", m.head_dim()}})
      if (r.value != 0)
        return Bad(absl::StrCat("model.", r.name), "comes from model.hf_dir's config.json; leave it out");
  }
  for (Req r : {Req{"hidden", m.hidden()}, Req{"num_layers", m.num_layers()}, Req{"num_heads", m.num_heads()},
                Req{"num_kv_heads", m.num_kv_heads()}, Req{"vocab_size", m.vocab_size()}, Req{"ffn", m.ffn()},
                Req{"seq_len", m.seq_len()}, Req{"global_batch", m.global_batch()}, Req{"micro_batch", m.micro_batch()}})
    if (r.value <= 0 && !(hf && std::string(r.name) != "seq_len" && std::string(r.name) != "global_batch" &&
                          std::string(r.name) != "micro_batch"))
      return Bad(absl::StrCat("model.", r.name), absl::StrCat("is required for ", spec.kind(), " jobs"));
  if (!hf && m.vocab_size() < 256)
    return Bad("model.vocab_size", absl::StrCat("must be >= 256 for byte-level tokens, got ", m.vocab_size()));
  // Sizes the engine multiplies: bounded so that no product overflows on the way.
  const int64_t micro_tokens = int64_t{m.micro_batch()} * m.seq_len();
  if (micro_tokens > kMaxMicroBatchTokens)
    return Bad("model.micro_batch", absl::StrCat("micro_batch x seq_len = ", micro_tokens, " tokens; at most ",
                                                 kMaxMicroBatchTokens, " per micro-batch"));
  const int64_t step_tokens = int64_t{m.global_batch()} * m.seq_len();
  if (step_tokens > kMaxStepTokens)
    return Bad("model.global_batch", absl::StrCat("global_batch x seq_len = ", step_tokens, " tokens; at most ",
                                                  kMaxStepTokens, " per step"));
  // (global_batch % (dp x micro_batch) == 0 was checked with the layout.)
  const int64_t micro_per_rank = m.global_batch() / (int64_t{m.micro_batch()} * l.dp());
  if (l.vpp() > 1 && micro_per_rank % l.pp() != 0)
    return Bad("model.global_batch", absl::StrCat("interleaved pipelines (vpp ", l.vpp(), ") need the micro-batches per ",
                                                  "step and DP rank (", micro_per_rank, ") to be a multiple of pp (",
                                                  l.pp(), ")"));
  auto* t = spec.mutable_train();
  if (t->steps() <= 0) return Bad("train.steps", absl::StrCat("is required for ", spec.kind(), " jobs"));
  if (t->lr() <= 0) return Bad("train.lr", absl::StrCat("is required for ", spec.kind(), " jobs"));
  if (t->min_lr() > t->lr()) return Bad("train.min_lr", absl::StrCat("must be <= lr (", t->lr(), ")"));
  if (t->clip_norm() == 0) t->set_clip_norm(1.0);
  if (t->init_std() == 0) t->set_init_std(0.02);
  if (t->data().kind().empty()) t->mutable_data()->set_kind("arithmetic");
  if (t->data().digits() == 0) t->mutable_data()->set_digits(3);
  if (t->data().kind() == "jsonl") {
    if (t->data().path().empty()) return Bad("train.data.path", "is required for jsonl data");
    TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute("train.data.path", t->data().path()));
  } else if (!t->data().path().empty()) {
    return Bad("train.data.path", "is only for jsonl data");
  }
  if (t->data().careless() > 0 && t->data().kind() != "arithmetic")
    return Bad("train.data.careless", "is only for the built-in arithmetic data");
  if (t->data().calculator() > 0 && t->data().kind() != "arithmetic")
    return Bad("train.data.calculator", "is only for the built-in arithmetic data");
  if (t->data().shuffle() && spec.kind() != "grpo" && spec.kind() != "ppo")
    return Bad("train.data.shuffle", absl::StrCat("is for grpo and ppo prompts, not ", spec.kind(), " data"));
  auto* c = t->mutable_checkpoint();
  for (auto [field, path] : {std::pair{"train.checkpoint.dir", c->dir()}, std::pair{"train.checkpoint.load", c->load()},
                             std::pair{"train.export_hf", t->export_hf()}})
    if (!path.empty()) TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute(field, path));
  if (!c->has_resume()) c->set_resume(true);
  if (c->dir().empty() && c->save_every() > 0) return Bad("train.checkpoint.save_every", "needs train.checkpoint.dir");
  if (c->dir().empty() && c->keep() > 0) return Bad("train.checkpoint.keep", "needs train.checkpoint.dir");
  return absl::OkStatus();
}

// grpo: as pretrain for the model and train sections (train.steps: GRPO steps; a
// train.checkpoint.load is the warm start and the reference; train.checkpoint.dir gets
// the job's own checkpoints, named by GRPO step, and resumes from them), on the built-in
// arithmetic problems or JSONL prompts with answers (train.data.kind jsonl: {"prompt",
// "answer"} per line; held-out evaluation is for the arithmetic problems only), with a
// layout the rollout engine runs (no pipeline, context or sequence parallelism). ppo: the
// same, with its own defaults (one completion per prompt, GAE, value clip, critic lr);
// its critic's fields are refused on grpo.
// A grpo / ppo job's groups after the actor (groups[0]), one of each role at most:
//  - rollout: a layout of its own, on devices of its own (split pools) or on the actor's
//    (colocate_with: the weights re-sliced in each executor). It runs generation only —
//    tp x dp — and takes the actor's weights after every update.
//  - reference: the frozen starting weights' log-probs, for a KL term (rl.kl_coef or, on
//    ppo, rl.kl_reward_coef); forward only — tp x dp, no zero.
//  - critic (ppo): the value model and its updates — tp x dp, any zero stage.
// Each has its own devices or shares another group's (colocate_with); the prompts of a
// step split over each group's DP ranks.
static absl::Status ValidateRlGroups(const JobSpec& spec) {
  const v1::GroupSpec& actor = spec.groups(0);
  if (spec.groups_size() > 1 && actor.role() != "actor" && actor.role() != "worker")
    return Bad("groups[0].role", absl::StrCat("the first group of a ", spec.kind(), " job is the actor, got '", actor.role(), "'"));
  std::set<std::string> seen;
  for (int i = 1; i < spec.groups_size(); ++i) {
    const v1::GroupSpec& g = spec.groups(i);
    const std::string p = absl::StrCat("groups[", i, "]");
    const std::string& role = g.role();
    if (role != "rollout" && role != "reference" && role != "critic" && role != "reward")
      return Bad(p + ".role", absl::StrCat("a ", spec.kind(), " job's groups after the actor are rollout, reference, critic or ",
                                           "reward, got '", role, "'"));
    if (!seen.insert(role).second) return Bad(p + ".role", absl::StrCat("a second ", role, " group; a job has one"));
    const auto& l = g.layout();
    if (l.pp() > 1 || l.cp() > 1 || l.sp())
      return Bad(p + ".layout", absl::StrCat("a ", role, " group runs tp x dp (pp=", l.pp(), ", cp=", l.cp(), ", sp=",
                                             l.sp() ? "true" : "false", ")"));
    if (role != "critic" && l.zero() > 0)
      return Bad(p + ".layout.zero", absl::StrCat(l.zero(), ": a ", role, " group has no optimizer to shard"));
    const int dp = std::max(1, l.dp());
    if (spec.rl().prompts_per_step() % dp != 0)
      return Bad("rl.prompts_per_step", absl::StrCat(spec.rl().prompts_per_step(), " prompts do not split over the ", role,
                                                     " group's dp=", dp, " ranks"));
    if (role == "rollout") {
      if (!g.colocate_with().empty() && g.colocate_with() != actor.name())
        return Bad(p + ".colocate_with", absl::StrCat("a rollout group shares the actor's devices ('", actor.name(),
                                                      "') or has its own, got '", g.colocate_with(), "'"));
      if (actor.layout().zero() >= 3)
        return Bad("groups[0].layout.zero", "3 (sharded parameters) with a rollout pool of its own is not supported yet");
      if (g.device_type() != actor.device_type())
        return Bad(p + ".device_type", "the rollout pool and the actor need the same kind of device (one bridge communicator)");
    } else if (role == "reference") {
      if (spec.rl().kl_coef() <= 0 && spec.rl().kl_reward_coef() <= 0)
        return Bad(p + ".role", "a reference group needs a KL term (rl.kl_coef or rl.kl_reward_coef) to use its log-probs");
    } else if (role == "reward") {
      if (spec.rl().reward_model().empty())
        return Bad(p + ".role", "a reward group needs rl.reward_model (the Hugging Face directory of its sequence classifier)");
    } else {
      if (spec.kind() != "ppo") return Bad(p + ".role", "a critic group is for ppo jobs (grpo has no critic)");
      const int64_t samples = int64_t(spec.rl().prompts_per_step() / dp) * spec.rl().group_size();
      if (spec.rl().mini_batches() > samples)
        return Bad("rl.mini_batches", absl::StrCat(spec.rl().mini_batches(), " mini-batches of ", samples,
                                                   " samples per DP rank of the critic group"));
    }
  }
  return absl::OkStatus();
}

// Multi-turn rollouts: an environment, the marker that ends a tool call, and more than one
// model turn go together.
static absl::Status ValidateEnvironment(v1::RlSpec& r) {
  if (r.max_turns() == 0) r.set_max_turns(1);
  if (r.environment_timeout_s() == 0) r.set_environment_timeout_s(30);
  if (r.environment().empty()) {
    for (auto [field, set] : {std::pair{"rl.tool_stop", !r.tool_stop().empty()}, std::pair{"rl.max_turns", r.max_turns() > 1},
                              std::pair{"rl.environment_ca_cert", !r.environment_ca_cert().empty()}})
      if (set) return Bad(field, "is for multi-turn rollouts: it needs rl.environment (host:port of an EnvironmentService)");
    return absl::OkStatus();
  }
  if (r.environment().rfind(':') == std::string::npos)
    return Bad("rl.environment", absl::StrCat("'", r.environment(), "' must be host:port"));
  if (r.tool_stop().empty()) return Bad("rl.tool_stop", "is required with rl.environment: the text that ends a tool call");
  if (r.max_turns() < 2)
    return Bad("rl.max_turns", "is 1 (single-turn): with rl.environment the model needs at least 2 turns to see an observation");
  if (!r.environment_ca_cert().empty()) TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute("rl.environment_ca_cert", r.environment_ca_cert()));
  return absl::OkStatus();
}

static absl::Status ValidateRl(JobSpec& spec) {
  const std::string& kind = spec.kind();  // grpo or ppo
  const auto& l = spec.groups(0).layout();
  if (l.pp() > 1 || l.cp() > 1 || l.sp())
    return Bad("groups[0].layout", absl::StrCat(kind, " runs generation on the actor's model: no pp, cp or sp yet (pp=",
                                                l.pp(), ", cp=", l.cp(), ", sp=", l.sp() ? "true" : "false", ")"));
  if (spec.train().data().careless() > 0)
    return Bad("train.data.careless", absl::StrCat("is for sft/pretrain data: ", kind, "'s reward always checks the true sum"));
  if (spec.train().data().calculator() > 0)
    return Bad("train.data.calculator", absl::StrCat("is for sft/pretrain data: a ", kind,
                                                     " job calls a calculator through rl.environment"));
  auto* r = spec.mutable_rl();
  const bool ppo = kind == "ppo";
  // The advantage estimator: ppo's critic gives GAE; the critic-free ones are grpo's.
  if (r->advantage().empty()) r->set_advantage(ppo ? "gae" : "grpo");
  auto estimator = rl::ParseAdvantageEstimator(r->advantage());
  if (!estimator.ok()) return Bad("rl.advantage", estimator.status().message());
  if (ppo && *estimator != rl::AdvantageEstimator::kGae)
    return Bad("rl.advantage", absl::StrCat("'", r->advantage(), "' on a ppo job: its critic gives GAE advantages (gae); ",
                                            "the critic-free estimators (grpo, rloo, reinforce_plus_plus) are kind grpo's"));
  if (!ppo && *estimator == rl::AdvantageEstimator::kGae)
    return Bad("rl.advantage", "gae needs a critic's values: kind ppo (grpo jobs take grpo, rloo or reinforce_plus_plus)");
  if (r->has_norm_adv_by_std() && *estimator != rl::AdvantageEstimator::kGrpo)
    return Bad("rl.norm_adv_by_std", absl::StrCat("is for rl.advantage grpo (this job's is ", r->advantage(), ")"));
  const bool discounted = ppo || *estimator == rl::AdvantageEstimator::kReinforcePlusPlus;  // reads rl.gamma
  if (ppo) {
    if (r->group_size() == 0) r->set_group_size(1);
    if (r->gamma() == 0) r->set_gamma(1.0);
    if (r->gae_lambda() == 0) r->set_gae_lambda(0.95);
    if (r->value_clip() == 0) r->set_value_clip(0.2);
    if (r->critic_lr() == 0) r->set_critic_lr(spec.train().lr());
  } else {
    for (auto [name, set] : {std::pair{"gae_lambda", r->gae_lambda() != 0}, std::pair{"value_clip", r->value_clip() != 0},
                             std::pair{"critic_lr", r->critic_lr() != 0}})
      if (set) return Bad(absl::StrCat("rl.", name), "is for ppo jobs (grpo has no critic)");
    if (r->gamma() != 0 && !discounted)
      return Bad("rl.gamma", absl::StrCat("discounts ppo's and reinforce_plus_plus's returns; rl.advantage ", r->advantage(),
                                          " scores whole responses"));
    if (discounted && r->gamma() == 0) r->set_gamma(1.0);
  }
  // KL estimators: each with its term.
  for (auto [name, value, coef, on] :
       {std::tuple{"kl_estimator", r->kl_estimator(), "kl_coef", r->kl_coef() > 0},
        std::tuple{"kl_reward_estimator", r->kl_reward_estimator(), "kl_reward_coef", r->kl_reward_coef() > 0}}) {
    if (value.empty()) continue;
    if (auto k = rl::ParseKlEstimator(value); !k.ok()) return Bad(absl::StrCat("rl.", name), k.status().message());
    if (!on) return Bad(absl::StrCat("rl.", name), absl::StrCat("has no effect without rl.", coef, " > 0"));
  }
  // The surrogate's clip range and dual clip.
  if (r->clip_low() >= 1) return Bad("rl.clip_low", absl::StrCat(r->clip_low(), ": expected < 1 (the ratio's floor 1 - clip_low > 0)"));
  if (r->has_dual_clip() && r->dual_clip() != 0 && r->dual_clip() <= 1)
    return Bad("rl.dual_clip", absl::StrCat(r->dual_clip(), ": expected > 1 (the cap is dual_clip x |A|), or 0 for off"));
  if (!r->loss_agg().empty()) {
    if (auto a = rl::ParseLossAggregation(r->loss_agg()); !a.ok()) return Bad("rl.loss_agg", a.status().message());
  }
  if (r->filter_groups()) {
    if (ppo) return Bad("rl.filter_groups", "is for grpo jobs (it drops prompt groups whose rewards are all equal)");
    if (r->max_gen_batches() == 0) r->set_max_gen_batches(4);
  } else if (r->max_gen_batches() != 0) {
    return Bad("rl.max_gen_batches", "bounds dynamic sampling's generations: set rl.filter_groups");
  }
  if (r->overlong_penalty() != 0 && r->overlong_buffer() == 0)
    return Bad("rl.overlong_penalty", "needs rl.overlong_buffer (the tokens before max_new_tokens where the penalty grows)");
  if (r->group_size() == 0) r->set_group_size(8);
  if (!ppo && r->group_size() < 2)
    return Bad("rl.group_size", absl::StrCat(r->group_size(), ": grpo needs >= 2 completions per prompt (group-normalized advantages)"));
  if (r->prompts_per_step() == 0) r->set_prompts_per_step(16);
  const bool arithmetic = spec.train().data().kind() == "arithmetic";
  if (r->max_new_tokens() == 0) r->set_max_new_tokens(arithmetic ? spec.train().data().digits() + 3 : 64);
  if (arithmetic && r->stop_size() == 0) r->add_stop(std::string(1, '\n'));  // (a literal trips GCC 12's -Wrestrict)
  // The byte tokenizer's stop strings are one byte; a tokenizer.json's (jsonl prompts)
  // are checked by the executors to be one token of it.
  const auto& m = spec.model();
  if (arithmetic || m.tokenizer() == "byte" || (m.tokenizer().empty() && m.hf_dir().empty())) {
    TESSERA_RETURN_IF_ERROR(CheckStops("rl.stop", r->stop()));
  } else {
    for (int i = 0; i < r->stop_size(); ++i)
      if (r->stop(i).empty()) return Bad(absl::StrCat("rl.stop[", i, "]"), "is empty");
  }
  if (r->overlong_buffer() >= r->max_new_tokens())
    return Bad("rl.overlong_buffer", absl::StrCat(r->overlong_buffer(), " tokens: expected fewer than rl.max_new_tokens (",
                                                  r->max_new_tokens(), ")"));
  if (spec.train().data().shuffle() && !(spec.train().data().kind() == "jsonl"))
    return Bad("train.data.shuffle", "is for JSONL prompts (the built-in problems are drawn at random already)");
  if (r->temperature() == 0) r->set_temperature(1.0);
  if (r->tis_cap() > 0 && r->temperature() != 1.0)
    return Bad("rl.tis_cap", absl::StrCat("compares the rollout's log-probs, of the distribution sampled at rl.temperature ",
                                          r->temperature(), ", with the trainer's at temperature 1: needs temperature 1"));
  if (r->clip() == 0) r->set_clip(0.2);
  if (r->epochs() == 0) r->set_epochs(1);
  if (r->mini_batches() == 0) r->set_mini_batches(1);
  if (r->max_tokens_per_micro_batch() == 0) r->set_max_tokens_per_micro_batch(16384);
  if (r->gpu_memory_utilization() == 0) r->set_gpu_memory_utilization(0.9);
  if (r->eval_every() == 0) r->set_eval_every(10);
  if (r->eval_problems() == 0) r->set_eval_problems(200);
  if (r->reward_timeout_s() == 0) r->set_reward_timeout_s(30);
  if (!r->reward_service().empty() && r->reward_service().rfind(':') == std::string::npos)
    return Bad("rl.reward_service", absl::StrCat("'", r->reward_service(), "' must be host:port"));
  if (!r->reward_ca_cert().empty()) {
    if (r->reward_service().empty()) return Bad("rl.reward_ca_cert", "needs rl.reward_service");
    TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute("rl.reward_ca_cert", r->reward_ca_cert()));
  }
  if (!r->eval_data().empty()) {
    TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute("rl.eval_data", r->eval_data()));
    if (spec.train().data().kind() != "jsonl")
      return Bad("rl.eval_data", absl::StrCat("held-out JSONL problems are for JSONL prompts (train.data.kind jsonl); the ",
                                              spec.train().data().kind(), " problems have their own held-out set"));
  }
  if (!r->reward_model().empty()) {
    TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute("rl.reward_model", r->reward_model()));
    if (!r->reward_service().empty())
      return Bad("rl.reward_model", "and rl.reward_service both give the reward; keep one");
    if (GroupWithRole(spec, "reward") == nullptr)
      return Bad("rl.reward_model", "needs a group of role reward to run it (groups[i].role: reward)");
  }
  if (r->prompts_per_step() % l.dp() != 0)
    return Bad("rl.prompts_per_step", absl::StrCat(r->prompts_per_step(), " prompts do not split over dp=", l.dp(), " ranks"));
  const int64_t samples = int64_t(r->prompts_per_step() / l.dp()) * r->group_size();
  if (int64_t{r->prompts_per_step()} * r->group_size() > kMaxRlSamples)
    return Bad("rl.group_size", absl::StrCat("prompts_per_step x group_size = ",
                                             int64_t{r->prompts_per_step()} * r->group_size(), " samples; at most ",
                                             kMaxRlSamples, " per step"));
  if (r->mini_batches() > samples)
    return Bad("rl.mini_batches", absl::StrCat(r->mini_batches(), " mini-batches of ", samples, " samples per DP rank"));
  TESSERA_RETURN_IF_ERROR(ValidateRlGroups(spec));
  TESSERA_RETURN_IF_ERROR(ValidateEnvironment(*r));
  if (r->max_staleness() > 0) {
    const v1::GroupSpec* pool = RolloutPool(spec);
    if (pool == nullptr || !pool->colocate_with().empty())
      return Bad("rl.max_staleness", "one step off generates while the actor trains: it needs a rollout group on devices of "
                                     "its own (groups[i].role: rollout, without colocate_with)");
  }
  return absl::OkStatus();
}

// generate: one worker group running the rollout engine over a JSONL file of prompts
// (docs/design.md §7): TP within a DP rank, no pipeline, context or sequence parallelism; the
// model's dims (or model.hf_dir); weights from generate.checkpoint or model.hf_dir.
static absl::Status ValidateGenerate(JobSpec& spec) {
  if (spec.groups_size() != 1) return Bad("groups", "a generate job has exactly one worker group");
  const auto& l = spec.groups(0).layout();
  if (l.pp() > 1 || l.cp() > 1 || l.sp() || l.zero() > 0)
    return Bad("groups[0].layout", absl::StrCat("generate runs tp x dp (pp=", l.pp(), ", cp=", l.cp(), ", sp=",
                                                l.sp() ? "true" : "false", ", zero=", l.zero(), ")"));
  const auto& m = spec.model();
  if (m.hf_dir().empty()) {
    for (auto [name, value] : {std::pair{"hidden", m.hidden()}, std::pair{"num_layers", m.num_layers()},
                               std::pair{"num_heads", m.num_heads()}, std::pair{"num_kv_heads", m.num_kv_heads()},
                               std::pair{"vocab_size", m.vocab_size()}, std::pair{"ffn", m.ffn()}})
      if (value <= 0) return Bad(absl::StrCat("model.", name), "is required for generate jobs (or model.hf_dir)");
    if (m.vocab_size() < 256) return Bad("model.vocab_size", "must be >= 256 (byte-level tokens)");
  } else {
    TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute("model.hf_dir", m.hf_dir()));
  }
  if (spec.has_train() && spec.train().steps() > 0) return Bad("train.steps", "is not for generate jobs");
  auto* g = spec.mutable_generate();
  if (g->input().empty()) return Bad("generate.input", "is required (a JSONL file of {\"prompt\": ...} objects)");
  if (g->output().empty()) return Bad("generate.output", "is required (the JSONL file the completions go to)");
  for (auto [field, path] : {std::pair{"generate.input", g->input()}, std::pair{"generate.output", g->output()},
                             std::pair{"generate.checkpoint", g->checkpoint()}})
    if (!path.empty()) TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute(field, path));
  if (g->input() == g->output()) return Bad("generate.output", "must not be the input file");
  if (g->checkpoint().empty() && m.hf_dir().empty())
    return Bad("generate.checkpoint", "is required without model.hf_dir (the weights to generate with)");
  if (!g->checkpoint().empty() && !m.hf_dir().empty())
    return Bad("generate.checkpoint", "and model.hf_dir both give weights; keep one");
  // With the byte tokenizer a stop string is one byte; with a tokenizer.json the executor
  // checks that each is one token of it.
  if (m.tokenizer() == "byte" || (m.tokenizer().empty() && m.hf_dir().empty())) {
    TESSERA_RETURN_IF_ERROR(CheckStops("generate.stop", g->stop()));
  } else {
    for (int i = 0; i < g->stop_size(); ++i)
      if (g->stop(i).empty()) return Bad(absl::StrCat("generate.stop[", i, "]"), "is empty");
  }
  if (g->max_new_tokens() == 0) g->set_max_new_tokens(64);
  if (m.hf_dir().empty()) {  // with hf_dir the executors take what generation_config.json sets
    if (!g->has_temperature()) g->set_temperature(1.0);
    if (!g->has_top_p()) g->set_top_p(1.0);
    if (!g->has_top_k()) g->set_top_k(0);
  }
  if (g->n() == 0) g->set_n(1);
  if (g->max_running() == 0) g->set_max_running(64);
  return absl::OkStatus();
}

// `stage_layers: auto`: the balanced split, written into the layout (see the proto).
static absl::Status BalanceStages(const v1::ModelShape& m, const std::string& path, v1::ParallelLayout* l) {
  if (l->pp() < 2) return Bad(path, absl::StrCat("auto balances a pipeline's stages; it needs pp >= 2, got pp = ", l->pp()));
  if (l->last_stage_layers() > 0) return Bad(path, "auto and last_stage_layers both set the split; give one of them");
  for (auto [name, value] : {std::pair{"num_layers", m.num_layers()}, std::pair{"hidden", m.hidden()},
                             std::pair{"num_heads", m.num_heads()}, std::pair{"num_kv_heads", m.num_kv_heads()},
                             std::pair{"ffn", m.ffn()}, std::pair{"vocab_size", m.vocab_size()},
                             std::pair{"seq_len", m.seq_len()}})
    if (value <= 0)
      return Bad(path, absl::StrCat("auto needs the model's shape in the job (model.", name,
                                    " is not given; with model.hf_dir the shape is read only by the executors): give "
                                    "the split itself — `tessera plan` prints the balanced one"));
  const int64_t head_dim = m.head_dim() > 0 ? m.head_dim() : m.hidden() / m.num_heads();
  const auto split = parallel::BalancedStageLayers(
      m.num_layers(), l->pp(), l->vpp() > 0 ? l->vpp() : 1,
      parallel::LlamaStageCosts(m.hidden(), m.num_heads(), m.num_kv_heads(), head_dim, m.ffn(), m.vocab_size(), m.seq_len()));
  l->clear_stage_layers();
  for (int n : split) l->add_stage_layers(n);
  l->set_balance_stages(false);
  return absl::OkStatus();
}

absl::Status NormalizeAndValidateJobSpec(JobSpec& spec) {
  // Ranges first: every rule below may multiply or divide by what it reads.
  TESSERA_RETURN_IF_ERROR(CheckJobSpecLimits(spec));
  if (spec.name().empty()) return Bad("name", "is required");
  if (!ValidName(spec.name()))
    return Bad("name", absl::StrCat("'", spec.name(), "' must be 1-63 characters of letters, digits, '-', '_' or '.', starting with a letter or digit"));
  static const std::set<std::string> kKnown = {"comm-check", "pretrain", "sft", "grpo", "ppo", "generate", "evaluate"};
  if (spec.kind().empty()) return Bad("kind", "is required (e.g. comm-check)");
  if (!kKnown.count(spec.kind()))
    return Bad("kind", absl::StrCat("unknown kind '", spec.kind(), "'; expected one of ", absl::StrJoin(kKnown, ", ")));
  if (!IsRunnableKind(spec.kind()))
    return absl::UnimplementedError(
        absl::StrCat("kind: '", spec.kind(),
                     "' jobs are not available in this build yet; available: comm-check, pretrain, sft, grpo, generate"));
  if (spec.groups_size() == 0) return Bad("groups", "at least one worker group is required");
  std::set<std::string> names;
  for (int i = 0; i < spec.groups_size(); ++i) {
    auto* g = spec.mutable_groups(i);
    std::string p = absl::StrCat("groups[", i, "]");
    if (!ValidName(g->name())) return Bad(p + ".name", absl::StrCat("'", g->name(), "' must be 1-63 characters of letters, digits, '-', '_' or '.', starting with a letter or digit"));
    if (!names.insert(g->name()).second) return Bad(p + ".name", absl::StrCat("duplicate group name '", g->name(), "'"));
    if (g->devices() < 1) return Bad(p + ".devices", "is required and must be >= 1");
    if (g->device_type() == v1::DEVICE_TYPE_UNSPECIFIED) g->set_device_type(v1::DEVICE_TYPE_CPU);
    if (g->placement() == v1::PLACEMENT_UNSPECIFIED) g->set_placement(v1::PLACEMENT_PACK);
    if (g->role().empty()) g->set_role("worker");
    static const std::set<std::string> kRoles = {"actor", "reference", "rollout", "critic", "reward", "worker"};
    if (!kRoles.count(g->role()))
      return Bad(p + ".role", absl::StrCat("unknown role '", g->role(), "'; expected one of ", absl::StrJoin(kRoles, ", ")));
    auto* l = g->mutable_layout();
    for (auto [get, set] : {std::pair{&v1::ParallelLayout::tp, &v1::ParallelLayout::set_tp},
                            std::pair{&v1::ParallelLayout::cp, &v1::ParallelLayout::set_cp},
                            std::pair{&v1::ParallelLayout::pp, &v1::ParallelLayout::set_pp},
                            std::pair{&v1::ParallelLayout::vpp, &v1::ParallelLayout::set_vpp}})
      if ((l->*get)() == 0) (l->*set)(1);
    if (int64_t{l->pp()} * l->vpp() > kMaxVirtualStages)
      return Bad(p + ".layout", absl::StrCat("pp x vpp = ", int64_t{l->pp()} * l->vpp(), " virtual stages; at most ",
                                             kMaxVirtualStages));
    if (l->dp() == 0) {
      const int64_t mp = int64_t{l->tp()} * l->cp() * l->pp();
      if (g->devices() % mp != 0)
        return Bad(p + ".layout", absl::StrCat("devices=", g->devices(), " is not divisible by tp*cp*pp = ", mp,
                                               ", so dp cannot be derived"));
      l->set_dp(static_cast<int>(g->devices() / mp));
    }
    if (l->balance_stages()) TESSERA_RETURN_IF_ERROR(BalanceStages(spec.model(), p + ".layout.stage_layers", l));
    parallel::Layout pl = LayoutOf(*l);
    const auto& m = spec.model();
    // Rollout and reference groups do not train: the training batch does not split over them.
    const bool trains = g->role() != "rollout" && g->role() != "reference";
    parallel::ModelShape ms{m.num_layers(), m.num_heads(), m.num_kv_heads(), m.vocab_size(),
                            m.seq_len(), trains ? m.global_batch() : 0, trains ? m.micro_batch() : 0};
    auto st = parallel::ValidateLayout(pl, g->devices(), ms);
    if (!st.ok()) return Bad(p, st.message());
  }
  for (int i = 0; i < spec.groups_size(); ++i) {
    const auto& g = spec.groups(i);
    if (g.colocate_with().empty()) continue;
    std::string p = absl::StrCat("groups[", i, "].colocate_with");
    const v1::GroupSpec* target = nullptr;
    for (const auto& o : spec.groups()) if (o.name() == g.colocate_with()) target = &o;
    if (!target) return Bad(p, absl::StrCat("no group named '", g.colocate_with(), "'"));
    if (target == &g) return Bad(p, "a group cannot colocate with itself");
    if (!target->colocate_with().empty())
      return Bad(p, absl::StrCat("'", target->name(), "' is itself colocated; colocate with '", target->colocate_with(), "' instead"));
    if (target->devices() != g.devices() || target->device_type() != g.device_type())
      return Bad(p, absl::StrCat("group '", g.name(), "' has ", g.devices(), " devices but '", target->name(),
                                 "' has ", target->devices(), "; colocated groups share the same devices"));
  }
  // offload: groups that take turns on shared devices (an RL job's), so another group of
  // the device set must exist for the states to make room for.
  for (int i = 0; i < spec.groups_size(); ++i) {
    const auto& g = spec.groups(i);
    if (!g.offload()) continue;
    const std::string p = absl::StrCat("groups[", i, "].offload");
    if (spec.kind() != "grpo" && spec.kind() != "ppo")
      return Bad(p, absl::StrCat("groups take turns on shared devices in grpo and ppo jobs; a ", spec.kind(),
                                 " job's group has nothing to make room for"));
    int sharing = 0;
    for (const auto& o : spec.groups()) sharing += DevicesOf(spec, o.name()) == DevicesOf(spec, g.name()) ? 1 : 0;
    if (sharing < 2)
      return Bad(p, absl::StrCat("group '", g.name(), "' shares its devices with no other group (colocate_with), so "
                                 "offloading it would only cost time"));
  }
  if (spec.kind() == "comm-check") {
    auto* c = spec.mutable_comm_check();
    if (c->sizes_bytes_size() == 0) for (int64_t s : {4096LL, 1LL << 20, 16LL << 20}) c->add_sizes_bytes(s);
    for (int i = 0; i < c->sizes_bytes_size(); ++i)
      if (c->sizes_bytes(i) < 4 || c->sizes_bytes(i) > (8LL << 30))
        return Bad(absl::StrCat("comm_check.sizes[", i, "]"), absl::StrCat("must be between 4 bytes and 8GiB, got ", c->sizes_bytes(i)));
    if (c->iters() == 0) c->set_iters(5);
    if (c->dtype().empty()) c->set_dtype("f32");
    if (c->dtype() != "f32" && c->dtype() != "i32" && c->dtype() != "bf16")
      return Bad("comm_check.dtype", absl::StrCat("expected f32, bf16 or i32, got '", c->dtype(), "'"));
    static const std::set<std::string> kColl = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"};
    if (c->collectives_size() == 0) for (auto& s : kColl) c->add_collectives(s);
    for (int i = 0; i < c->collectives_size(); ++i)
      if (!kColl.count(c->collectives(i)))
        return Bad(absl::StrCat("comm_check.collectives[", i, "]"),
                   absl::StrCat("unknown collective '", c->collectives(i), "'; expected one of ", absl::StrJoin(kColl, ", ")));
    for (int i = 0; i < c->groups_size(); ++i) {
      auto k = parallel::ParseGroupKind(c->groups(i));
      if (!k.ok()) return Bad(absl::StrCat("comm_check.groups[", i, "]"), k.status().message());
    }
  }
  const bool rl = spec.kind() == "grpo" || spec.kind() == "ppo";
  if (spec.kind() == "pretrain" || spec.kind() == "sft" || rl) TESSERA_RETURN_IF_ERROR(ValidatePretrain(spec));
  if (rl) TESSERA_RETURN_IF_ERROR(ValidateRl(spec));
  if (!rl && spec.has_rl()) return Bad("rl", absl::StrCat("is only for grpo and ppo jobs, not ", spec.kind()));
  if (spec.kind() == "generate") TESSERA_RETURN_IF_ERROR(ValidateGenerate(spec));
  if (spec.kind() != "generate" && spec.has_generate())
    return Bad("generate", absl::StrCat("is only for generate jobs, not ", spec.kind()));
  // A tokenizer reads and writes text: generate lines and jsonl training data. The
  // built-in tasks and RL prompts are byte tokens still.
  if (const std::string& tok = spec.model().tokenizer(); !tok.empty() && tok != "byte") {
    TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute("model.tokenizer", tok));
    if (spec.kind() != "generate" && spec.train().data().kind() != "jsonl")
      return Bad("model.tokenizer", absl::StrCat("is for generate jobs and jsonl data; the built-in ", spec.kind(),
                                                 " data is byte tokens"));
  }
  // NCCL's tuning and its network's choice (interfaces, HCAs, GPUDirect, transports), not
  // what loads code or reads files (NCCL_NET_PLUGIN, NCCL_TOPO_FILE); OpenMP's threads.
  static const std::set<std::string> kEnvAllowed = {
      "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS",
      "NCCL_BUFFSIZE", "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD",
      "NCCL_IB_HCA", "NCCL_IB_DISABLE", "NCCL_IB_GID_INDEX", "NCCL_IB_TC", "NCCL_IB_SL", "NCCL_IB_TIMEOUT",
      "NCCL_IB_RETRY_CNT", "NCCL_IB_QPS_PER_CONNECTION", "NCCL_NET", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ",
      "NCCL_CROSS_NIC", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "OMP_NUM_THREADS"};
  for (const auto& [k, v] : spec.env())
    if (!kEnvAllowed.count(k))
      return Bad(absl::StrCat("env.", k), absl::StrCat("not an allowed variable; allowed: ", absl::StrJoin(kEnvAllowed, ", ")));
  if (spec.restart_backoff_s() == 0) spec.set_restart_backoff_s(1.0);
  if (spec.collective_timeout_ms() == 0) spec.set_collective_timeout_ms(120000);
  if (spec.start_timeout_ms() == 0) spec.set_start_timeout_ms(120000);
  return absl::OkStatus();
}

namespace {
std::string WithoutPrefix(const std::string& name, absl::string_view prefix) {
  if (name.empty()) return "UNKNOWN";
  return absl::StartsWith(name, prefix) ? name.substr(prefix.size()) : name;
}
}  // namespace

std::string JobStateName(v1::JobState s) { return WithoutPrefix(v1::JobState_Name(s), "JOB_STATE_"); }
std::string NodeStateName(v1::NodeState s) { return WithoutPrefix(v1::NodeState_Name(s), "NODE_STATE_"); }

parallel::Layout LayoutOf(const v1::ParallelLayout& l) {
  return parallel::Layout{l.tp(),  l.cp(),   l.dp(),   l.pp(), l.vpp(), l.sp(), l.zero(), l.last_stage_layers(),
                          std::vector<int>(l.stage_layers().begin(), l.stage_layers().end())};
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_STOPPED;
}

std::vector<std::pair<std::string, std::string>> JobPathFields(const v1::JobSpec& spec) {
  const auto& c = spec.train().checkpoint();
  std::vector<std::pair<std::string, std::string>> out;
  for (auto [field, path] : {std::pair{"train.checkpoint.dir", c.dir()}, std::pair{"train.checkpoint.load", c.load()},
                             std::pair{"train.export_hf", spec.train().export_hf()},
                             std::pair{"model.hf_dir", spec.model().hf_dir()},
                             std::pair{"train.data.path", spec.train().data().path()},
                             std::pair{"generate.input", spec.generate().input()},
                             std::pair{"generate.output", spec.generate().output()},
                             std::pair{"generate.checkpoint", spec.generate().checkpoint()},
                             std::pair{"model.tokenizer", spec.model().tokenizer() == "byte" ? std::string() : spec.model().tokenizer()},
                             std::pair{"rl.reward_ca_cert", spec.rl().reward_ca_cert()},
                             std::pair{"rl.environment_ca_cert", spec.rl().environment_ca_cert()},
                             std::pair{"rl.reward_model", spec.rl().reward_model()},
                             std::pair{"rl.eval_data", spec.rl().eval_data()}})
    if (!path.empty()) out.emplace_back(field, path);
  return out;
}

namespace {
// Whether `path` is `root` or below it (both absolute, without trailing slashes but "/").
bool Under(const std::string& path, std::string root) {
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return path == root || absl::StartsWith(path, root == "/" ? root : root + "/");
}
}  // namespace

absl::Status CheckJobPaths(const v1::JobSpec& spec, const std::vector<std::string>& roots) {
  for (const auto& [field, path] : JobPathFields(spec)) {
    TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute(field, path));
    bool inside = false;
    for (const std::string& root : roots) inside |= Under(path, root);
    if (roots.empty())
      return absl::PermissionDeniedError(absl::StrCat(field, ": '", path, "': this controller allows no paths in job ",
                                                      "specs (start it with --path-root DIR)"));
    if (!inside)
      return absl::PermissionDeniedError(absl::StrCat(field, ": '", path, "' is outside the controller's path roots (",
                                                      absl::StrJoin(roots, ", "), ")"));
  }
  return absl::OkStatus();
}

std::string ResolvePath(const std::string& path) {
  // The deepest ancestor that exists, resolved; the components below it (not there yet:
  // an output, a checkpoint directory to be made) appended as written.
  std::string head = path, tail;
  while (true) {
    char buf[PATH_MAX];
    if (::realpath(head.c_str(), buf) != nullptr) {
      std::string r = buf;
      return tail.empty() ? r : (r == "/" ? "" : r) + tail;
    }
    const auto slash = head.rfind('/');
    if (slash == std::string::npos || head.size() <= 1) return path;
    tail = head.substr(slash) + tail;
    head = slash == 0 ? "/" : head.substr(0, slash);
  }
}

absl::Status CheckJobPathsResolved(const v1::JobSpec& spec, const std::vector<std::string>& roots) {
  std::vector<std::string> real_roots;
  for (const auto& r : roots) real_roots.push_back(ResolvePath(r));
  for (const auto& [field, path] : JobPathFields(spec)) {
    const std::string real = ResolvePath(path);
    bool inside = false;
    for (const auto& r : real_roots) inside |= Under(real, r);
    if (!inside)
      return absl::PermissionDeniedError(absl::StrCat(field, ": '", path, "' resolves to '", real,
                                                      "' (through a symbolic link), outside the controller's path roots (",
                                                      absl::StrJoin(roots, ", "), ")"));
  }
  return absl::OkStatus();
}

}  // namespace tessera
