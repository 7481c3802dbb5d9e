#include "common/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <functional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/parallel/layout.h"

namespace tessera {
namespace {

using v1::JobSpec;

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

std::string Show(const YAML::Node& n) {
  if (n.IsScalar()) return absl::StrCat("'", n.Scalar(), "'");
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "nothing";
}

absl::Status CheckKeys(const YAML::Node& n, const std::string& path,
                       const std::set<std::string>& allowed) {
  if (!n.IsMap()) return Bad(path.empty() ? "job" : path, absl::StrCat("expected a mapping, got ", Show(n)));
  for (const auto& kv : n) {
    std::string key = kv.first.Scalar();
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

absl::StatusOr<int64_t> AsInt(const YAML::Node& n, const std::string& path, int64_t lo, int64_t hi) {
  int64_t v = 0;
  if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &v))
    return Bad(path, absl::StrCat("expected an integer, got ", Show(n)));
  if (v < lo || v > hi) return Bad(path, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  return v;
}

absl::StatusOr<double> AsDouble(const YAML::Node& n, const std::string& path, double lo, double hi) {
  double v = 0;
  if (!n.IsScalar() || !absl::SimpleAtod(n.Scalar(), &v))
    return Bad(path, absl::StrCat("expected a number, got ", Show(n)));
  if (!(v >= lo && v <= hi)) return Bad(path, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
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

#define ASSIGN_INT(field, node, path, lo, hi)                  \
  do {                                                         \
    TESSERA_ASSIGN_OR_RETURN(auto _v, AsInt(node, path, lo, hi)); \
    field(_v);                                                 \
  } while (0)

absl::Status ParseLayout(const YAML::Node& n, const std::string& path, v1::ParallelLayout* l) {
  TESSERA_RETURN_IF_ERROR(
      CheckKeys(n, path, {"tp", "cp", "dp", "pp", "vpp", "sp", "zero", "last_stage_layers", "stage_layers"}));
  for (const auto& kv : n) {
    std::string k = kv.first.Scalar(), p = Join(path, k);
    const YAML::Node& v = kv.second;
    if (k == "tp") ASSIGN_INT(l->set_tp, v, p, 1, 1024);
    else if (k == "cp") ASSIGN_INT(l->set_cp, v, p, 1, 1024);
    else if (k == "dp") ASSIGN_INT(l->set_dp, v, p, 1, 65536);
    else if (k == "pp") ASSIGN_INT(l->set_pp, v, p, 1, 1024);
    else if (k == "vpp") ASSIGN_INT(l->set_vpp, v, p, 1, 1024);
    else if (k == "zero") ASSIGN_INT(l->set_zero, v, p, 0, 3);
    else if (k == "last_stage_layers") ASSIGN_INT(l->set_last_stage_layers, v, p, 0, 1 << 20);
    else if (k == "stage_layers") {  // a list, "3,2,2,1" (for --set), or auto (balanced when validated)
      TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> items, AsStringList(v, p));
      l->clear_stage_layers();
      l->set_balance_stages(items.size() == 1 && items[0] == "auto");
      if (l->balance_stages()) continue;
      for (size_t i = 0; i < items.size(); ++i) {
        int n = 0;
        if (!absl::SimpleAtoi(items[i], &n) || n < 0 || n > (1 << 20))
          return Bad(absl::StrCat(p, "[", i, "]"), absl::StrCat("expected a layer count >= 0, got '", items[i], "'"));
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
    if (k == "num_layers") ASSIGN_INT(m->set_num_layers, v, p, 1, kMax);
    else if (k == "num_heads") ASSIGN_INT(m->set_num_heads, v, p, 1, kMax);
    else if (k == "num_kv_heads") ASSIGN_INT(m->set_num_kv_heads, v, p, 1, kMax);
    else if (k == "vocab_size") ASSIGN_INT(m->set_vocab_size, v, p, 1, kMax);
    else if (k == "seq_len") ASSIGN_INT(m->set_seq_len, v, p, 1, kMax);
    else if (k == "global_batch") ASSIGN_INT(m->set_global_batch, v, p, 1, kMax);
    else if (k == "micro_batch") ASSIGN_INT(m->set_micro_batch, v, p, 1, kMax);
    else if (k == "hidden") ASSIGN_INT(m->set_hidden, v, p, 1, kMax);
    else if (k == "ffn") ASSIGN_INT(m->set_ffn, v, p, 1, kMax);
    else if (k == "head_dim") ASSIGN_INT(m->set_head_dim, v, p, 2, 1024);
    else if (k == "rope_base") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p, 2, 1e12));
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
                                              "schedule", "precision"}));
  for (const auto& kv : n) {
    std::string k = kv.first.Scalar(), p = Join(path, k);
    const YAML::Node& v = kv.second;
    if (k == "steps") ASSIGN_INT(t->set_steps, v, p, 1, 100000000);
    else if (k == "warmup_steps") ASSIGN_INT(t->set_warmup_steps, v, p, 0, 100000000);
    else if (k == "seed") ASSIGN_INT(t->set_seed, v, p, 0, int64_t(1) << 62);
    else if (k == "recompute") {
      TESSERA_ASSIGN_OR_RETURN(bool b, AsBool(v, p));
      t->set_recompute(b);
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
          ASSIGN_INT(c->set_save_every, d.second, cp, 0, 100000000);
        } else if (ck == "keep") {
          ASSIGN_INT(c->set_keep, d.second, cp, 0, 1000000);
        } else if (ck == "resume") {
          TESSERA_ASSIGN_OR_RETURN(bool b, AsBool(d.second, cp));
          c->set_resume(b);
        }
      }
    } else if (k == "data") {
      TESSERA_RETURN_IF_ERROR(CheckKeys(v, p, {"kind", "digits", "path", "careless"}));
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
          ASSIGN_INT(t->mutable_data()->set_digits, d.second, dp, 1, 9);
        } else if (dk == "careless") {
          TESSERA_ASSIGN_OR_RETURN(double f, AsDouble(d.second, dp, 0, 1));
          t->mutable_data()->set_careless(f);
        }
      }
    } else {
      struct Range {
        const char* key;
        double lo, hi;
        void (v1::TrainSpec::*set)(double);
      };
      for (Range r : {Range{"lr", 1e-9, 10, &v1::TrainSpec::set_lr}, Range{"min_lr", 0, 10, &v1::TrainSpec::set_min_lr},
                      Range{"weight_decay", 0, 10, &v1::TrainSpec::set_weight_decay},
                      Range{"clip_norm", -1, 1e6, &v1::TrainSpec::set_clip_norm},
                      Range{"init_std", 1e-6, 10, &v1::TrainSpec::set_init_std}})
        if (k == r.key) {
          TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p, r.lo, r.hi));
          (t->*r.set)(d);
        }
    }
  }
  return absl::OkStatus();
}

absl::Status ParseGroup(const YAML::Node& n, const std::string& path, v1::GroupSpec* g) {
  TESSERA_RETURN_IF_ERROR(CheckKeys(
      n, path, {"name", "role", "devices", "device", "placement", "colocate_with", "layout"}));
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
      ASSIGN_INT(g->set_devices, v, p, 1, 65536);
    } else if (k == "device") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      s = absl::AsciiStrToLower(s);
      if (s == "cpu") g->set_device_type(v1::CPU);
      else if (s == "gpu" || s == "cuda") g->set_device_type(v1::GPU);
      else return Bad(p, absl::StrCat("expected cpu or gpu, got '", s, "'"));
    } else if (k == "placement") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      s = absl::AsciiStrToLower(s);
      if (s == "pack") g->set_placement(v1::PACK);
      else if (s == "spread") g->set_placement(v1::SPREAD);
      else return Bad(p, absl::StrCat("expected pack or spread, got '", s, "'"));
    } else if (k == "colocate_with") {
      TESSERA_ASSIGN_OR_RETURN(auto s, AsString(v, p));
      g->set_colocate_with(s);
    } else if (k == "layout") {
      TESSERA_RETURN_IF_ERROR(ParseLayout(v, p, g->mutable_layout()));
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
        c->add_sizes_bytes(*b);
      }
    } else if (k == "iters") {
      ASSIGN_INT(c->set_iters, v, p, 1, 100000);
    } else if (k == "warmup") {
      ASSIGN_INT(c->set_warmup, v, p, 0, 100000);
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

// Each stop string is one byte: one token of the byte tokenizer.
absl::Status CheckStops(const std::string& field, const google::protobuf::RepeatedPtrField<std::string>& stops) {
  for (int i = 0; i < stops.size(); ++i)
    if (stops.Get(i).size() != 1)
      return Bad(absl::StrCat(field, "[", i, "]"), absl::StrCat("'", stops.Get(i), "' is ", stops.Get(i).size(),
                                                                " bytes; stop strings are one byte (one token of the byte tokenizer)"));
  return absl::OkStatus();
}

absl::Status ParseRl(const YAML::Node& n, const std::string& path, v1::RlSpec* r) {
  TESSERA_RETURN_IF_ERROR(CheckKeys(n, path, {"group_size", "prompts_per_step", "max_new_tokens", "temperature", "kl_coef",
                                              "clip", "epochs", "mini_batches", "eval_every", "eval_problems", "reward_service",
                                              "reward_timeout_s", "reward_ca_cert", "stop", "entropy_coef", "gamma", "gae_lambda",
                                              "value_clip", "critic_lr", "kl_reward_coef"}));
  for (const auto& kv : n) {
    const std::string k = kv.first.Scalar(), p = Join(path, k);
    const YAML::Node& v = kv.second;
    if (k == "group_size") ASSIGN_INT(r->set_group_size, v, p, 1, 4096);
    else if (k == "prompts_per_step") ASSIGN_INT(r->set_prompts_per_step, v, p, 1, 1000000);
    else if (k == "max_new_tokens") ASSIGN_INT(r->set_max_new_tokens, v, p, 1, 1000000);
    else if (k == "epochs") ASSIGN_INT(r->set_epochs, v, p, 1, 1000);
    else if (k == "mini_batches") ASSIGN_INT(r->set_mini_batches, v, p, 1, 1000000);
    else if (k == "eval_every") ASSIGN_INT(r->set_eval_every, v, p, 1, 1000000);
    else if (k == "eval_problems") ASSIGN_INT(r->set_eval_problems, v, p, 1, 1000000);
    else if (k == "reward_service" || k == "reward_ca_cert") {
      TESSERA_ASSIGN_OR_RETURN(auto str, AsString(v, p));
      k == "reward_service" ? r->set_reward_service(str) : r->set_reward_ca_cert(str);
    } else if (k == "reward_timeout_s") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p, 0.001, 3600));
      r->set_reward_timeout_s(d);
    } else if (k == "stop") {
      TESSERA_RETURN_IF_ERROR(ParseStops(v, p, r->mutable_stop()));
    }
    else {
      const bool unit = k == "clip" || k == "gamma" || k == "gae_lambda";  // within (0, 1]
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p, unit ? 1e-6 : 0, unit ? 1 : 100));
      if (k == "temperature") r->set_temperature(d);
      else if (k == "kl_coef") r->set_kl_coef(d);
      else if (k == "entropy_coef") r->set_entropy_coef(d);
      else if (k == "gamma") r->set_gamma(d);
      else if (k == "gae_lambda") r->set_gae_lambda(d);
      else if (k == "value_clip") r->set_value_clip(d);
      else if (k == "critic_lr") r->set_critic_lr(d);
      else if (k == "kl_reward_coef") r->set_kl_reward_coef(d);
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
    } else if (k == "max_new_tokens") ASSIGN_INT(g->set_max_new_tokens, v, p, 1, 1000000);
    else if (k == "top_k") ASSIGN_INT(g->set_top_k, v, p, 0, 100000000);
    else if (k == "n") ASSIGN_INT(g->set_n, v, p, 1, 4096);
    else if (k == "seed") ASSIGN_INT(g->set_seed, v, p, 0, int64_t{1} << 62);
    else if (k == "max_running") ASSIGN_INT(g->set_max_running, v, p, 1, 65536);
    else if (k == "cache_tokens") ASSIGN_INT(g->set_cache_tokens, v, p, 1, int64_t{1} << 40);
    else if (k == "temperature") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p, 0, 100));
      g->set_temperature(d);
    } else if (k == "top_p") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, p, 1e-6, 1));
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
      ASSIGN_INT(spec->set_max_restarts, v, k, 0, 1000);
    } else if (k == "restart_backoff_s") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, k, 0, 3600));
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
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, k, 0.1, 86400));
      spec->set_collective_timeout_ms(static_cast<int64_t>(d * 1000));
    } else if (k == "start_timeout_s") {
      TESSERA_ASSIGN_OR_RETURN(double d, AsDouble(v, k, 1, 86400));
      spec->set_start_timeout_ms(static_cast<int64_t>(d * 1000));
    } else if (k == "env") {
      if (!v.IsMap()) return Bad(k, absl::StrCat("expected a mapping of NAME: value, got ", Show(v)));
      for (const auto& e : v) {
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

const v1::GroupSpec* RolloutPool(const v1::JobSpec& spec) {
  if ((spec.kind() != "grpo" && spec.kind() != "ppo") || spec.groups_size() != 2) return nullptr;
  const v1::GroupSpec& g = spec.groups(1);
  return g.role() == "rollout" ? &g : nullptr;
}

bool IsRunnableKind(absl::string_view kind) {
  return kind == "comm-check" || kind == "pretrain" || kind == "sft" || kind == "grpo" || kind == "ppo" ||
         kind == "generate";
}

namespace {
bool ValidName(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s)
    if (!(absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}
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
  if (spec.groups_size() != 1 && !(rl && spec.groups_size() == 2))
    return Bad("groups", absl::StrCat("a ", spec.kind(), " job has exactly one worker group",
                                      rl ? " (or two: the actor and a rollout pool)" : ""));
  const auto& l = spec.groups(0).layout();
  if (l.vpp() > 1 && spec.model().global_batch() / (spec.model().micro_batch() * l.dp()) % l.pp() != 0)
    return Bad("model.global_batch", absl::StrCat("interleaved pipelines (vpp ", l.vpp(), ") need the micro-batches per ",
                                                  "step and DP rank (", spec.model().global_batch() /
                                                  (spec.model().micro_batch() * l.dp()), ") to be a multiple of pp (",
                                                  l.pp(), ")"));
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
// A grpo / ppo job's second group: the rollout, with a layout of its own, on devices of
// its own (split pools) or on the actor's (colocate_with: the weights re-sliced in each
// executor). It runs generation only — tp x dp — and takes the actor's weights after
// every update.
static absl::Status ValidateRolloutPool(const JobSpec& spec) {
  if (spec.groups_size() < 2) return absl::OkStatus();
  const v1::GroupSpec& g = spec.groups(1);
  if (g.role() != "rollout")
    return Bad("groups[1].role", absl::StrCat("a ", spec.kind(), " job's second group is its rollout pool: role rollout, got '", g.role(), "'"));
  if (!g.colocate_with().empty() && g.colocate_with() != spec.groups(0).name())
    return Bad("groups[1].colocate_with", absl::StrCat("a rollout group shares the actor's devices ('", spec.groups(0).name(),
                                                       "') or has its own, got '", g.colocate_with(), "'"));
  if (spec.groups(0).role() != "actor" && spec.groups(0).role() != "worker")
    return Bad("groups[0].role", absl::StrCat("the first group of a split ", spec.kind(), " job is the actor, got '", spec.groups(0).role(), "'"));
  const auto& l = g.layout();
  if (l.pp() > 1 || l.cp() > 1 || l.sp() || l.zero() > 0)
    return Bad("groups[1].layout", absl::StrCat("a rollout pool runs tp x dp (pp=", l.pp(), ", cp=", l.cp(), ", sp=",
                                                l.sp() ? "true" : "false", ", zero=", l.zero(), ")"));
  if (spec.groups(0).layout().zero() >= 3)
    return Bad("groups[0].layout.zero", "3 (sharded parameters) with a rollout pool of its own is not supported yet");
  if (g.device_type() != spec.groups(0).device_type())
    return Bad("groups[1].device_type", "the rollout pool and the actor need the same kind of device (one bridge communicator)");
  const int dp = std::max(1, l.dp());
  if (spec.rl().prompts_per_step() % dp != 0)
    return Bad("rl.prompts_per_step", absl::StrCat(spec.rl().prompts_per_step(), " prompts do not split over the rollout pool's dp=", dp, " ranks"));
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
  auto* r = spec.mutable_rl();
  const bool ppo = kind == "ppo";
  if (ppo) {
    if (r->group_size() == 0) r->set_group_size(1);
    if (r->gamma() == 0) r->set_gamma(1.0);
    if (r->gae_lambda() == 0) r->set_gae_lambda(0.95);
    if (r->value_clip() == 0) r->set_value_clip(0.2);
    if (r->critic_lr() == 0) r->set_critic_lr(spec.train().lr());
  } else {
    for (auto [name, set] : {std::pair{"gamma", r->gamma() != 0}, std::pair{"gae_lambda", r->gae_lambda() != 0},
                             std::pair{"value_clip", r->value_clip() != 0}, std::pair{"critic_lr", r->critic_lr() != 0},
                             std::pair{"kl_reward_coef", r->kl_reward_coef() != 0}})
      if (set) return Bad(absl::StrCat("rl.", name), "is for ppo jobs (grpo has no critic)");
  }
  if (r->group_size() == 0) r->set_group_size(8);
  if (!ppo && r->group_size() < 2)
    return Bad("rl.group_size", absl::StrCat(r->group_size(), ": grpo needs >= 2 completions per prompt (group-normalized advantages)"));
  if (r->prompts_per_step() == 0) r->set_prompts_per_step(16);
  const bool arithmetic = spec.train().data().kind() == "arithmetic";
  if (r->max_new_tokens() == 0) r->set_max_new_tokens(arithmetic ? spec.train().data().digits() + 3 : 64);
  if (arithmetic && r->stop_size() == 0) r->add_stop("\n");
  // The byte tokenizer's stop strings are one byte; a tokenizer.json's (jsonl prompts)
  // are checked by the executors to be one token of it.
  const auto& m = spec.model();
  if (arithmetic || m.tokenizer() == "byte" || (m.tokenizer().empty() && m.hf_dir().empty())) {
    TESSERA_RETURN_IF_ERROR(CheckStops("rl.stop", r->stop()));
  } else {
    for (int i = 0; i < r->stop_size(); ++i)
      if (r->stop(i).empty()) return Bad(absl::StrCat("rl.stop[", i, "]"), "is empty");
  }
  if (r->temperature() == 0) r->set_temperature(1.0);
  if (r->clip() == 0) r->set_clip(0.2);
  if (r->epochs() == 0) r->set_epochs(1);
  if (r->mini_batches() == 0) r->set_mini_batches(1);
  if (r->eval_every() == 0) r->set_eval_every(10);
  if (r->eval_problems() == 0) r->set_eval_problems(200);
  if (r->reward_timeout_s() == 0) r->set_reward_timeout_s(30);
  if (!r->reward_service().empty() && r->reward_service().rfind(':') == std::string::npos)
    return Bad("rl.reward_service", absl::StrCat("'", r->reward_service(), "' must be host:port"));
  if (!r->reward_ca_cert().empty()) {
    if (r->reward_service().empty()) return Bad("rl.reward_ca_cert", "needs rl.reward_service");
    TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute("rl.reward_ca_cert", r->reward_ca_cert()));
  }
  if (r->prompts_per_step() % l.dp() != 0)
    return Bad("rl.prompts_per_step", absl::StrCat(r->prompts_per_step(), " prompts do not split over dp=", l.dp(), " ranks"));
  const int64_t samples = int64_t(r->prompts_per_step() / l.dp()) * r->group_size();
  if (r->mini_batches() > samples)
    return Bad("rl.mini_batches", absl::StrCat(r->mini_batches(), " mini-batches of ", samples, " samples per DP rank"));
  TESSERA_RETURN_IF_ERROR(ValidateRolloutPool(spec));
  return absl::OkStatus();
}

// generate: one worker group running the rollout engine over a JSONL file of prompts
// (DESIGN §7): TP within a DP rank, no pipeline, context or sequence parallelism; the
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
  if (!g->has_temperature()) g->set_temperature(1.0);
  if (g->top_p() == 0) g->set_top_p(1.0);
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
  if (spec.name().empty()) return Bad("name", "is required");
  if (!ValidName(spec.name()))
    return Bad("name", absl::StrCat("'", spec.name(), "' must be 1-63 characters of letters, digits, '-', '_' or '.'"));
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
    if (!ValidName(g->name())) return Bad(p + ".name", absl::StrCat("'", g->name(), "' must be 1-63 characters of letters, digits, '-', '_' or '.'"));
    if (!names.insert(g->name()).second) return Bad(p + ".name", absl::StrCat("duplicate group name '", g->name(), "'"));
    if (g->devices() < 1) return Bad(p + ".devices", "is required and must be >= 1");
    if (g->device_type() == v1::DEVICE_TYPE_UNSPECIFIED) g->set_device_type(v1::CPU);
    if (g->placement() == v1::PLACEMENT_UNSPECIFIED) g->set_placement(v1::PACK);
    if (g->role().empty()) g->set_role("worker");
    auto* l = g->mutable_layout();
    for (auto [get, set] : {std::pair{&v1::ParallelLayout::tp, &v1::ParallelLayout::set_tp},
                            std::pair{&v1::ParallelLayout::cp, &v1::ParallelLayout::set_cp},
                            std::pair{&v1::ParallelLayout::pp, &v1::ParallelLayout::set_pp},
                            std::pair{&v1::ParallelLayout::vpp, &v1::ParallelLayout::set_vpp}})
      if ((l->*get)() == 0) (l->*set)(1);
    if (l->dp() == 0) {
      int mp = l->tp() * l->cp() * l->pp();
      if (g->devices() % mp != 0)
        return Bad(p + ".layout", absl::StrCat("devices=", g->devices(), " is not divisible by tp*cp*pp = ", mp,
                                               ", so dp cannot be derived"));
      l->set_dp(g->devices() / mp);
    }
    if (l->balance_stages()) TESSERA_RETURN_IF_ERROR(BalanceStages(spec.model(), p + ".layout.stage_layers", l));
    parallel::Layout pl = LayoutOf(*l);
    const auto& m = spec.model();
    // A rollout group generates: the training batch does not split over it.
    const bool trains = g->role() != "rollout";
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
  static const std::set<std::string> kEnvAllowed = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_ALGO", "NCCL_PROTO",
                                                    "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE",
                                                    "OMP_NUM_THREADS"};
  for (const auto& [k, v] : spec.env())
    if (!kEnvAllowed.count(k))
      return Bad(absl::StrCat("env.", k), absl::StrCat("not an allowed variable; allowed: ", absl::StrJoin(kEnvAllowed, ", ")));
  if (spec.restart_backoff_s() == 0) spec.set_restart_backoff_s(1.0);
  if (spec.collective_timeout_ms() == 0) spec.set_collective_timeout_ms(120000);
  if (spec.start_timeout_ms() == 0) spec.set_start_timeout_ms(120000);
  return absl::OkStatus();
}

std::string JobStateName(v1::JobState s) {
  std::string n = v1::JobState_Name(s);
  return n.empty() ? "UNKNOWN" : n;
}

parallel::Layout LayoutOf(const v1::ParallelLayout& l) {
  return parallel::Layout{l.tp(),  l.cp(),   l.dp(),   l.pp(), l.vpp(), l.sp(), l.zero(), l.last_stage_layers(),
                          std::vector<int>(l.stage_layers().begin(), l.stage_layers().end())};
}

bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::STOPPED;
}

absl::Status CheckJobPaths(const v1::JobSpec& spec, const std::vector<std::string>& roots) {
  const auto& c = spec.train().checkpoint();
  for (auto [field, path] : {std::pair{"train.checkpoint.dir", c.dir()}, std::pair{"train.checkpoint.load", c.load()},
                             std::pair{"train.export_hf", spec.train().export_hf()},
                             std::pair{"model.hf_dir", spec.model().hf_dir()},
                             std::pair{"train.data.path", spec.train().data().path()},
                             std::pair{"generate.input", spec.generate().input()},
                             std::pair{"generate.output", spec.generate().output()},
                             std::pair{"generate.checkpoint", spec.generate().checkpoint()},
                             std::pair{"model.tokenizer", spec.model().tokenizer() == "byte" ? std::string() : spec.model().tokenizer()},
                             std::pair{"rl.reward_ca_cert", spec.rl().reward_ca_cert()}}) {
    if (path.empty()) continue;
    TESSERA_RETURN_IF_ERROR(CheckCleanAbsolute(field, path));
    bool inside = false;
    for (std::string root : roots) {
      while (root.size() > 1 && root.back() == '/') root.pop_back();
      if (path == root || absl::StartsWith(path, root == "/" ? root : root + "/")) inside = true;
    }
    if (roots.empty())
      return absl::PermissionDeniedError(absl::StrCat(field, ": '", path, "': this controller allows no paths in job ",
                                                      "specs (start it with --path-root DIR)"));
    if (!inside)
      return absl::PermissionDeniedError(absl::StrCat(field, ": '", path, "' is outside the controller's path roots (",
                                                      absl::StrJoin(roots, ", "), ")"));
  }
  return absl::OkStatus();
}

}  // namespace tessera
