#include "common/spec/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <functional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/spec/job_spec_internal.h"
#include "common/spec/job_spec_limits.h"
#include "common/status.h"
#include "common/util.h"
#include "common/parallel/layout.h"

namespace tessera {
namespace {

using v1::JobSpec;

using job_spec_internal::Bad;

std::string Show(const YAML::Node& n) {
  if (n.IsScalar()) return absl::StrCat("'", n.Scalar(), "'");
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "nothing";
}

absl::Status CheckKeys(const YAML::Node& n, const std::string& path,
                       const std::set<std::string>& allowed) {
  if (!n.IsMap()) return Bad(path.empty() ? "job" : path, absl::StrCat("expected a mapping, got ", Show(n)));
  std::set<std::string> seen;
  for (const auto& kv : n) {
    std::string key = kv.first.Scalar();
    // YAML leaves a repeated key to the reader; a job file that says two things of one
    // field is refused rather than one of them silently winning.
    if (!seen.insert(key).second)
      return Bad(path.empty() ? key : absl::StrCat(path, ".", key), "is given twice");
    if (!allowed.count(key)) {
      return Bad(path.empty() ? key : absl::StrCat(path, ".", key),
                 absl::StrCat("unknown key; expected one of ", absl::StrJoin(allowed, ", ")));
    }
  }
  return absl::OkStatus();
}

std::string Join(const std::string& path, const std::string& key) {
  return path.empty() ? key : absl::StrCat(path, ".", key);
}

// The proto path of a YAML path: list indices dropped ("groups[0].layout.tp" ->
// "groups.layout.tp"), the key of the limits table (common/spec/job_spec_limits.h).
std::string ProtoPath(const std::string& yaml) {
  std::string out;
  for (size_t i = 0; i < yaml.size(); ++i) {
    if (yaml[i] == '[') i = yaml.find(']', i);
    if (i == std::string::npos) break;
    if (yaml[i] != ']') out += yaml[i];
  }
  return out;
}

// Numbers are checked against the limits table as they are read (the same rules the
// validator applies to the proto), so that an out-of-range value never reaches a field
// narrower than int64 and a job file's error names the key as written.
absl::StatusOr<int64_t> AsInt(const YAML::Node& n, const std::string& path) {
  int64_t v = 0;
  if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &v))
    return Bad(path, absl::StrCat("expected an integer, got ", Show(n)));
  TESSERA_RETURN_IF_ERROR(CheckJobSpecValue(ProtoPath(path), path, static_cast<double>(v), true));
  return v;
}

// `proto`: the table's key where the job file's key differs from the proto's
// (collective_timeout_s is collective_timeout_ms), with the value as the proto holds it.
absl::StatusOr<double> AsDouble(const YAML::Node& n, const std::string& path, const std::string& proto = "",
                                double scale = 1) {
  double v = 0;
  if (!n.IsScalar() || !absl::SimpleAtod(n.Scalar(), &v))
    return Bad(path, absl::StrCat("expected a number, got ", Show(n)));
  if (!std::isfinite(v)) return Bad(path, absl::StrCat("must be a finite number, got ", Show(n)));
  TESSERA_RETURN_IF_ERROR(CheckJobSpecValue(proto.empty() ? ProtoPath(path) : proto, path, v * scale, false));
  return v;
}

absl::StatusOr<bool> AsBool(const YAML::Node& n, const std::string& path) {
  if (n.IsScalar()) {
    std::string s = absl::AsciiStrToLower(n.Scalar());
    if (s == "true" || s == "yes" || s == "on" || s == "1") return true;
    if (s == "false" || s == "no" || s == "off" || s == "0") return false;
  }
  return Bad(path, absl::StrCat("expected true or false, got ", Show(n)));
}

absl::StatusOr<std::string> AsString(const YAML::Node& n, const std::string& path) {
  if (!n.IsScalar()) return Bad(path, absl::StrCat("expected a string, got ", Show(n)));
  return n.Scalar();
}

absl::StatusOr<std::vector<std::string>> AsStringList(const YAML::Node& n, const std::string& path) {
  std::vector<std::string> out;
  if (n.IsScalar()) {  // a single value or a comma-separated list, for --set convenience
    for (auto s : absl::StrSplit(n.Scalar(), ',', absl::SkipWhitespace()))
      out.emplace_back(absl::StripAsciiWhitespace(s));
    return out;
  }
  if (!n.IsSequence()) return Bad(path, absl::StrCat("expected a list, got ", Show(n)));
  for (size_t i = 0; i < n.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(auto s, AsString(n[i], absl::StrCat(path, "[", i, "]")));
    out.push_back(s);
  }
  return out;
}

#define ASSIGN_INT(field, node, path)                   \
  do {                                                 \
    TESSERA_ASSIGN_OR_RETURN(auto _v, AsInt(node, path)); \
    field(_v);                                         \
  } while (0)

absl::Status ParseLayout(const YAML::Node& n, const std::string& path, v1::ParallelLayout* l) {
  TESSERA_RETURN_IF_ERROR(
      CheckKeys(n, path, {"tp", "cp", "dp", "pp", "vpp", "sp", "zero", "last_stage_layers", "stage_layers"}));
  for (const auto& kv : n) {
    std::string k = kv.first.Scalar(), p = Join(path, k);
    const YAML::Node& v = kv.second;
    if (k == "tp") ASSIGN_INT(l->set_tp, v, p);
    else if (k == "cp") ASSIGN_INT(l->set_cp, v, p);
    else if (k == "dp") ASSIGN_INT(l->set_dp, v, p);
    else if (k == "pp") ASSIGN_INT(l->set_pp, v, p);
    else if (k == "vpp") ASSIGN_INT(l->set_vpp, v, p);
    else if (k == "zero") ASSIGN_INT(l->set_zero, v, p);
    else if (k == "last_stage_layers") ASSIGN_INT(l->set_last_stage_layers, v, p);
    else if (k == "stage_layers") {  // a list, "3,2,2,1" (for --set), or auto (balanced when validated)
      TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> items, AsStringList(v, p));
      l->clear_stage_layers();
      l->set_balance_stages(items.size() == 1 && items[0] == "auto");
      if (l->balance_stages()) continue;
      for (size_t i = 0; i < items.size(); ++i) {
        int n = 0;
        const std::string at = absl::StrCat(p, "[", i, "]");
        if (!absl::SimpleAtoi(items[i], &n))
          return Bad(at, absl::StrCat("expected a layer count >= 0, got '", items[i], "'"));
        TESSERA_RETURN_IF_ERROR(CheckJobSpecValue("groups.layout.stage_layers", at, n, true));
        l->add_stage_layers(n);
      }
    }
    else if (k == "sp") {
      TESSERA_ASSIGN_OR_RETURN(bool b, AsBool(v, p));
      l->set_sp(b);
    }
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const YAML::Node& n, const std::string& path, v1::ModelShape* m) {
  TESSERA_RETURN_IF_ERROR(CheckKeys(n, path, {"num_layers", "num_heads", "num_kv_heads", "vocab_size", "seq_len",
                                              "global_batch", "micro_batch", "hidden", "ffn", "head_dim", "rope_base",
                                              "tie_embeddings", "qkv_bias", "hf_dir", "tokenizer"}));
  const int64_t kMax = 1 << 30;
  for (const auto& kv : n) {
    std::string k = kv.first.Scalar(), p = Join(path, k);
    const YAML::Node& v = kv.second;
    if (k == "num_layers") ASSIGN_INT(m->set_num_layers, v, p);
    else if (k == "num_heads") ASSIGN_INT(m->set_num_heads, v, p);
    else if (k == "num_kv_heads") ASSIGN_INT(m->set_num_kv_heads, v, p);
    else if (k == "vocab_size") ASSIGN_INT(m->set_vocab_size, v, p);
    else if (k == "seq_len") ASSIGN_INT(m->set_seq_len, v, p);
    else if (k == "global_batch") ASSIGN_INT(m->set_global_batch, v, p);
    else if (k == "micro_batch") ASSIGN_INT(m->set_micro_batch, v, p);
    else if (k == "hidden") ASSIGN_INT(m->set_hidden, v, p);
    else if (k == "ffn") ASSIGN_INT(m->set_ffn, v, p);
    else if (k == "head_dim") ASSIGN_INT(m->set_head_dim, v, p);
    else if (k == "rope_base") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p));
      m->set_rope_base(d);
    } else if (k == "tie_embeddings" || k == "qkv_bias") {
      TESSERA_ASSIGN_OR_RETURN(bool b, AsBool(v, p));
      k == "qkv_bias" ? m->set_qkv_bias(b) : m->set_tie_embeddings(b);
    } else if (k == "hf_dir" || k == "tokenizer") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      k == "hf_dir" ? m->set_hf_dir(s) : m->set_tokenizer(s);
    }
  }
  return absl::OkStatus();
}

absl::Status ParseTrain(const YAML::Node& n, const std::string& path, v1::TrainSpec* t) {
  TESSERA_RETURN_IF_ERROR(CheckKeys(n, path, {"steps", "lr", "min_lr", "warmup_steps", "weight_decay", "clip_norm",
                                              "seed", "data", "init_std", "checkpoint", "recompute", "export_hf",
                                              "schedule", "precision", "recompute_swiglu"}));
  for (const auto& kv : n) {
    std::string k = kv.first.Scalar(), p = Join(path, k);
    const YAML::Node& v = kv.second;
    if (k == "steps") ASSIGN_INT(t->set_steps, v, p);
    else if (k == "warmup_steps") ASSIGN_INT(t->set_warmup_steps, v, p);
    else if (k == "seed") ASSIGN_INT(t->set_seed, v, p);
    else if (k == "recompute") {
      TESSERA_ASSIGN_OR_RETURN(bool b, AsBool(v, p));
      t->set_recompute(b);
    } else if (k == "recompute_swiglu") {
      TESSERA_ASSIGN_OR_RETURN(bool b, AsBool(v, p));
      t->set_recompute_swiglu(b);
    } else if (k == "export_hf") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      t->set_export_hf(s);
    } else if (k == "schedule") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      if (s != "1f1b" && s != "gpipe") return Bad(p, absl::StrCat("expected 1f1b or gpipe, got '", s, "'"));
      t->set_schedule(s);
    } else if (k == "precision") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      if (s != "auto" && s != "bf16" && s != "f32") return Bad(p, absl::StrCat("expected auto, bf16 or f32, got '", s, "'"));
      t->set_precision(s);
    } else if (k == "checkpoint") {
      TESSERA_RETURN_IF_ERROR(CheckKeys(v, p, {"dir", "save_every", "resume", "load", "keep"}));
      auto* c = t->mutable_checkpoint();
      for (const auto& d : v) {
        const std::string ck = d.first.Scalar(), cp = Join(p, ck);
        if (ck == "dir" || ck == "load") {
          TESSERA_ASSIGN_OR_RETURN(auto s, AsString(d.second, cp));
          ck == "dir" ? c->set_dir(s) : c->set_load(s);
        } else if (ck == "save_every") {
          ASSIGN_INT(c->set_save_every, d.second, cp);
        } else if (ck == "keep") {
          ASSIGN_INT(c->set_keep, d.second, cp);
        } else if (ck == "resume") {
          TESSERA_ASSIGN_OR_RETURN(bool b, AsBool(d.second, cp));
          c->set_resume(b);
        }
      }
    } else if (k == "data") {
      TESSERA_RETURN_IF_ERROR(CheckKeys(v, p, {"kind", "digits", "path", "careless", "shuffle", "calculator"}));
      for (const auto& d : v) {
        const std::string dk = d.first.Scalar(), dp = Join(p, dk);
        if (dk == "kind") {
          TESSERA_ASSIGN_OR_RETURN(auto kind, AsString(d.second, dp));
          if (kind != "arithmetic" && kind != "jsonl")
            return Bad(dp, absl::StrCat("expected arithmetic or jsonl, got '", kind, "'"));
          t->mutable_data()->set_kind(kind);
        } else if (dk == "path") {
          TESSERA_ASSIGN_OR_RETURN(auto path, AsString(d.second, dp));
          t->mutable_data()->set_path(path);
        } else if (dk == "digits") {
          ASSIGN_INT(t->mutable_data()->set_digits, d.second, dp);
        } else if (dk == "careless" || dk == "calculator") {
          TESSERA_ASSIGN_OR_RETURN(double f, AsDouble(d.second, dp));
          dk == "careless" ? t->mutable_data()->set_careless(f) : t->mutable_data()->set_calculator(f);
        } else if (dk == "shuffle") {
          TESSERA_ASSIGN_OR_RETURN(bool b, AsBool(d.second, dp));
          t->mutable_data()->set_shuffle(b);
        }
      }
    } else {
      struct Setter {
        const char* key;
        void (v1::TrainSpec::*set)(double);
      };
      for (Setter r : {Setter{"lr", &v1::TrainSpec::set_lr}, Setter{"min_lr", &v1::TrainSpec::set_min_lr},
                       Setter{"weight_decay", &v1::TrainSpec::set_weight_decay},
                       Setter{"clip_norm", &v1::TrainSpec::set_clip_norm}, Setter{"init_std", &v1::TrainSpec::set_init_std}})
        if (k == r.key) {
          TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p));
          (t->*r.set)(d);
        }
    }
  }
  return absl::OkStatus();
}

absl::Status ParseGroup(const YAML::Node& n, const std::string& path, v1::GroupSpec* g) {
  TESSERA_RETURN_IF_ERROR(CheckKeys(
      n, path, {"name", "role", "devices", "device", "placement", "colocate_with", "layout", "offload"}));
  for (const auto& kv : n) {
    std::string k = kv.first.Scalar(), p = Join(path, k);
    const YAML::Node& v = kv.second;
    if (k == "name") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      g->set_name(s);
    } else if (k == "role") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      g->set_role(s);
    } else if (k == "devices") {
      ASSIGN_INT(g->set_devices, v, p);
    } else if (k == "device") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      s = absl::AsciiStrToLower(s);
      if (s == "cpu") g->set_device_type(v1::DEVICE_TYPE_CPU);
      else if (s == "gpu" || s == "cuda") g->set_device_type(v1::DEVICE_TYPE_GPU);
      else return Bad(p, absl::StrCat("expected cpu or gpu, got '", s, "'"));
    } else if (k == "placement") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      s = absl::AsciiStrToLower(s);
      if (s == "pack") g->set_placement(v1::PLACEMENT_PACK);
      else if (s == "spread") g->set_placement(v1::PLACEMENT_SPREAD);
      else return Bad(p, absl::StrCat("expected pack or spread, got '", s, "'"));
    } else if (k == "colocate_with") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      g->set_colocate_with(s);
    } else if (k == "layout") {
      TESSERA_RETURN_IF_ERROR(ParseLayout(v, p, g->mutable_layout()));
    } else if (k == "offload") {
      TESSERA_ASSIGN_OR_RETURN(bool b, AsBool(v, p));
      g->set_offload(b);
    }
  }
  return absl::OkStatus();
}

absl::Status ParseCommCheck(const YAML::Node& n, const std::string& path, v1::CommCheckSpec* c) {
  TESSERA_RETURN_IF_ERROR(CheckKeys(n, path, {"sizes", "iters", "warmup", "dtype", "collectives", "groups"}));
  for (const auto& kv : n) {
    std::string k = kv.first.Scalar(), p = Join(path, k);
    const YAML::Node& v = kv.second;
    if (k == "sizes") {
      TESSERA_ASSIGN_OR_RETURN(auto list, AsStringList(v, p));
      for (size_t i = 0; i < list.size(); ++i) {
        auto b = ParseBytes(list[i]);
        if (!b.ok()) return Bad(absl::StrCat(p, "[", i, "]"), b.status().message());
        TESSERA_RETURN_IF_ERROR(CheckJobSpecValue("comm_check.sizes_bytes", absl::StrCat(p, "[", i, "]"),
                                                  static_cast<double>(*b), true));
        c->add_sizes_bytes(*b);
      }
    } else if (k == "iters") {
      ASSIGN_INT(c->set_iters, v, p);
    } else if (k == "warmup") {
      ASSIGN_INT(c->set_warmup, v, p);
    } else if (k == "dtype") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      c->set_dtype(s);
    } else if (k == "collectives") {
      TESSERA_ASSIGN_OR_RETURN(auto list, AsStringList(v, p));
      for (auto& s : list) c->add_collectives(s);
    } else if (k == "groups") {
      TESSERA_ASSIGN_OR_RETURN(auto list, AsStringList(v, p));
      for (auto& s : list) c->add_groups(s);
    }
  }
  return absl::OkStatus();
}

// Stop strings: one or a list, kept as written (no splitting or trimming: "\n" is one).
absl::Status ParseStops(const YAML::Node& v, const std::string& p, google::protobuf::RepeatedPtrField<std::string>* out) {
  if (v.IsScalar()) {
    out->Add(std::string(v.Scalar()));
  } else if (v.IsSequence()) {
    for (size_t i = 0; i < v.size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(auto str, AsString(v[i], absl::StrCat(p, "[", i, "]")));
      out->Add(std::move(str));
    }
  } else {
    return Bad(p, absl::StrCat("expected a string or a list of strings, got ", Show(v)));
  }
  return absl::OkStatus();
}


absl::Status ParseRl(const YAML::Node& n, const std::string& path, v1::RlSpec* r) {
  TESSERA_RETURN_IF_ERROR(CheckKeys(n, path, {"group_size", "prompts_per_step", "max_new_tokens", "temperature", "kl_coef",
                                              "clip", "epochs", "mini_batches", "eval_every", "eval_problems", "reward_service",
                                              "reward_timeout_s", "reward_ca_cert", "stop", "entropy_coef", "gamma", "gae_lambda",
                                              "value_clip", "critic_lr", "kl_reward_coef", "max_tokens_per_micro_batch",
                                              "gpu_memory_utilization", "reward_model", "eval_data", "advantage",
                                              "norm_adv_by_std", "kl_estimator", "kl_reward_estimator", "clip_low",
                                              "clip_high", "dual_clip", "loss_agg", "overlong_buffer", "overlong_penalty",
                                              "filter_groups", "max_gen_batches", "tis_cap", "max_staleness", "environment",
                                              "tool_stop", "max_turns", "environment_timeout_s", "environment_ca_cert"}));
  for (const auto& kv : n) {
    const std::string k = kv.first.Scalar(), p = Join(path, k);
    const YAML::Node& v = kv.second;
    if (k == "group_size") ASSIGN_INT(r->set_group_size, v, p);
    else if (k == "prompts_per_step") ASSIGN_INT(r->set_prompts_per_step, v, p);
    else if (k == "max_new_tokens") ASSIGN_INT(r->set_max_new_tokens, v, p);
    else if (k == "epochs") ASSIGN_INT(r->set_epochs, v, p);
    else if (k == "mini_batches") ASSIGN_INT(r->set_mini_batches, v, p);
    else if (k == "max_tokens_per_micro_batch") ASSIGN_INT(r->set_max_tokens_per_micro_batch, v, p);
    else if (k == "eval_every") ASSIGN_INT(r->set_eval_every, v, p);
    else if (k == "eval_problems") ASSIGN_INT(r->set_eval_problems, v, p);
    else if (k == "overlong_buffer") ASSIGN_INT(r->set_overlong_buffer, v, p);
    else if (k == "max_gen_batches") ASSIGN_INT(r->set_max_gen_batches, v, p);
    else if (k == "max_staleness") ASSIGN_INT(r->set_max_staleness, v, p);
    else if (k == "max_turns") ASSIGN_INT(r->set_max_turns, v, p);
    else if (k == "norm_adv_by_std" || k == "filter_groups") {
      TESSERA_ASSIGN_OR_RETURN(bool b, AsBool(v, p));
      k == "filter_groups" ? r->set_filter_groups(b) : r->set_norm_adv_by_std(b);
    } else if (k == "reward_service" || k == "reward_ca_cert" || k == "reward_model" || k == "eval_data" ||
               k == "advantage" || k == "kl_estimator" || k == "kl_reward_estimator" || k == "loss_agg" ||
               k == "environment" || k == "tool_stop" || k == "environment_ca_cert") {
      TESSERA_ASSIGN_OR_RETURN(auto str, AsString(v, p));
      if (k == "reward_service") r->set_reward_service(str);
      else if (k == "environment") r->set_environment(str);
      else if (k == "tool_stop") r->set_tool_stop(str);
      else if (k == "environment_ca_cert") r->set_environment_ca_cert(str);
      else if (k == "reward_ca_cert") r->set_reward_ca_cert(str);
      else if (k == "eval_data") r->set_eval_data(str);
      else if (k == "advantage") r->set_advantage(str);
      else if (k == "kl_estimator") r->set_kl_estimator(str);
      else if (k == "kl_reward_estimator") r->set_kl_reward_estimator(str);
      else if (k == "loss_agg") r->set_loss_agg(str);
      else r->set_reward_model(str);
    } else if (k == "reward_timeout_s" || k == "environment_timeout_s") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p));
      k == "reward_timeout_s" ? r->set_reward_timeout_s(d) : r->set_environment_timeout_s(d);
    } else if (k == "stop") {
      TESSERA_RETURN_IF_ERROR(ParseStops(v, p, r->mutable_stop()));
    }
    else {
      const bool unit = k == "clip" || k == "gamma" || k == "gae_lambda";  // within (0, 1]
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p));
      if (k == "temperature") r->set_temperature(d);
      else if (k == "kl_coef") r->set_kl_coef(d);
      else if (k == "entropy_coef") r->set_entropy_coef(d);
      else if (k == "gamma") r->set_gamma(d);
      else if (k == "gae_lambda") r->set_gae_lambda(d);
      else if (k == "value_clip") r->set_value_clip(d);
      else if (k == "critic_lr") r->set_critic_lr(d);
      else if (k == "kl_reward_coef") r->set_kl_reward_coef(d);
      else if (k == "gpu_memory_utilization") r->set_gpu_memory_utilization(d);
      else if (k == "clip_low") r->set_clip_low(d);
      else if (k == "clip_high") r->set_clip_high(d);
      else if (k == "dual_clip") r->set_dual_clip(d);
      else if (k == "overlong_penalty") r->set_overlong_penalty(d);
      else if (k == "tis_cap") r->set_tis_cap(d);
      else r->set_clip(d);
    }
  }
  return absl::OkStatus();
}

absl::Status ParseGenerate(const YAML::Node& n, const std::string& path, v1::GenerateSpec* g) {
  TESSERA_RETURN_IF_ERROR(CheckKeys(n, path, {"input", "output", "checkpoint", "max_new_tokens", "temperature", "top_k",
                                              "top_p", "n", "seed", "stop", "max_running", "cache_tokens"}));
  for (const auto& kv : n) {
    const std::string k = kv.first.Scalar(), p = Join(path, k);
    const YAML::Node& v = kv.second;
    if (k == "input" || k == "output" || k == "checkpoint") {
      TESSERA_ASSIGN_OR_RETURN(auto str, AsString(v, p));
      k == "input" ? g->set_input(str) : k == "output" ? g->set_output(str) : g->set_checkpoint(str);
    } else if (k == "max_new_tokens") ASSIGN_INT(g->set_max_new_tokens, v, p);
    else if (k == "top_k") ASSIGN_INT(g->set_top_k, v, p);
    else if (k == "n") ASSIGN_INT(g->set_n, v, p);
    else if (k == "seed") ASSIGN_INT(g->set_seed, v, p);
    else if (k == "max_running") ASSIGN_INT(g->set_max_running, v, p);
    else if (k == "cache_tokens") ASSIGN_INT(g->set_cache_tokens, v, p);
    else if (k == "temperature") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p));
      g->set_temperature(d);
    } else if (k == "top_p") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p));
      g->set_top_p(d);
    } else if (k == "stop") {
      TESSERA_RETURN_IF_ERROR(ParseStops(v, p, g->mutable_stop()));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseJob(const YAML::Node& root, JobSpec* spec) {
  TESSERA_RETURN_IF_ERROR(CheckKeys(root, "", {"name", "kind", "groups", "max_restarts", "restart_backoff_s",
                                               "model", "comm_check", "collective_timeout_s",
                                               "start_timeout_s", "env", "train", "rl", "generate"}));
  for (const auto& kv : root) {
    std::string k = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (k == "name") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, k));
      spec->set_name(s);
    } else if (k == "kind") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, k));
      spec->set_kind(s);
    } else if (k == "groups") {
      if (!v.IsSequence()) return Bad(k, absl::StrCat("expected a list of worker groups, got ", Show(v)));
      for (size_t i = 0; i < v.size(); ++i)
        TESSERA_RETURN_IF_ERROR(ParseGroup(v[i], absl::StrCat("groups[", i, "]"), spec->add_groups()));
    } else if (k == "max_restarts") {
      ASSIGN_INT(spec->set_max_restarts, v, k);
    } else if (k == "restart_backoff_s") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, k));
      spec->set_restart_backoff_s(d);
    } else if (k == "model") {
      TESSERA_RETURN_IF_ERROR(ParseModel(v, k, spec->mutable_model()));
    } else if (k == "comm_check") {
      TESSERA_RETURN_IF_ERROR(ParseCommCheck(v, k, spec->mutable_comm_check()));
    } else if (k == "train") {
      TESSERA_RETURN_IF_ERROR(ParseTrain(v, k, spec->mutable_train()));
    } else if (k == "rl") {
      TESSERA_RETURN_IF_ERROR(ParseRl(v, k, spec->mutable_rl()));
    } else if (k == "generate") {
      TESSERA_RETURN_IF_ERROR(ParseGenerate(v, k, spec->mutable_generate()));
    } else if (k == "collective_timeout_s") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, k, "collective_timeout_ms", 1000));
      spec->set_collective_timeout_ms(static_cast<int64_t>(d * 1000));
    } else if (k == "start_timeout_s") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, k, "start_timeout_ms", 1000));
      spec->set_start_timeout_ms(static_cast<int64_t>(d * 1000));
    } else if (k == "env") {
      if (!v.IsMap()) return Bad(k, absl::StrCat("expected a mapping of NAME: value, got ", Show(v)));
      std::set<std::string> seen;
      for (const auto& e : v) {
        if (!seen.insert(e.first.Scalar()).second) return Bad(Join(k, e.first.Scalar()), "is given twice");
        TESSERA_ASSIGN_OR_RETURN(auto val, AsString(e.second, Join(k, e.first.Scalar())));
        (*spec->mutable_env())[e.first.Scalar()] = val;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyOverride(YAML::Node& root, const std::string& ov) {
  auto eq = ov.find('=');
  if (eq == std::string::npos || eq == 0)
    return absl::InvalidArgumentError(absl::StrCat("--set '", ov, "': expected key=value"));
  std::string key = ov.substr(0, eq), value = ov.substr(eq + 1);
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", key, ": cannot parse value: ", e.what()));
  }
  std::vector<std::string> parts = absl::StrSplit(key, '.');
  // yaml-cpp nodes are reference-like; walk with a stack of nodes.
  std::function<absl::Status(YAML::Node, size_t)> walk = [&](YAML::Node n, size_t i) -> absl::Status {
    const std::string& part = parts[i];
    bool last = i + 1 == parts.size();
    if (n.IsSequence()) {
      size_t idx = 0;
      if (!absl::SimpleAtoi(part, &idx) || idx >= n.size())
        return absl::InvalidArgumentError(absl::StrCat("--set ", key, ": '", part, "' is not an index of a list of ", n.size()));
      if (last) { n[idx] = parsed; return absl::OkStatus(); }
      return walk(n[idx], i + 1);
    }
    if (!n.IsMap() && !n.IsNull())
      return absl::InvalidArgumentError(absl::StrCat("--set ", key, ": '", part, "' is under a scalar"));
    if (last) { n[part] = parsed; return absl::OkStatus(); }
    YAML::Node child = n[part];
    if (!child.IsDefined() || child.IsNull()) { n[part] = YAML::Node(YAML::NodeType::Map); child = n[part]; }
    return walk(child, i + 1);
  };
  return walk(root, 0);
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpecYaml(absl::string_view yaml, const std::vector<std::string>& overrides) {
  if (yaml.size() > kMaxJobSpecBytes)
    return absl::InvalidArgumentError(
        absl::StrCat("job file: ", yaml.size(), " bytes; at most ", kMaxJobSpecBytes, " are allowed"));
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job file is not valid YAML: ", e.what()));
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  for (const auto& ov : overrides) TESSERA_RETURN_IF_ERROR(ApplyOverride(root, ov));
  JobSpec spec;
  try {
    TESSERA_RETURN_IF_ERROR(ParseJob(root, &spec));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job file: ", e.what()));
  }
  return spec;
}

}  // namespace tessera
