// The JobSpec bounds table and its check over the proto, by reflection (so that a field
// added to the proto without a bound is found by UnboundedJobSpecFields, not missed).
#include "common/spec/job_spec_limits.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cmath>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec_internal.h"
#include "common/status.h"

namespace tessera {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using job_spec_internal::Bad;

constexpr double kGiB = 1024.0 * 1024 * 1024;

std::vector<FieldLimit> MakeTable() {
  // {proto path, lo, hi, 0 = not given, max items, yaml name, display scale}
  return {
      {"max_restarts", 0, 1000},
      {"restart_backoff_s", 0, 3600},
      {"collective_timeout_ms", 100, 86400000, true, 0, "collective_timeout_s", 1000},
      {"start_timeout_ms", 1000, 86400000, true, 0, "start_timeout_s", 1000},
      {"groups", 0, 0, false, 16},
      {"env", 0, 0, false, 16},
      {"groups.devices", 1, 65536, true},
      {"groups.layout.tp", 1, 1024, true},
      {"groups.layout.cp", 1, 1024, true},
      {"groups.layout.dp", 1, 65536, true},
      {"groups.layout.pp", 1, 1024, true},
      {"groups.layout.vpp", 1, 1024, true},
      {"groups.layout.zero", 0, 3},
      {"groups.layout.last_stage_layers", 0, 4096},
      {"groups.layout.stage_layers", 0, 4096, false, 4096},
      {"model.num_layers", 1, 4096, true},
      {"model.num_heads", 1, 4096, true},
      {"model.num_kv_heads", 1, 4096, true},
      {"model.vocab_size", 1, 16777216, true},
      {"model.seq_len", 1, 16777216, true},
      {"model.global_batch", 1, 16777216, true},
      {"model.micro_batch", 1, 1048576, true},
      {"model.hidden", 1, 131072, true},
      {"model.ffn", 1, 1048576, true},
      {"model.head_dim", 2, 1024, true},
      {"model.rope_base", 2, 1e12, true},
      {"comm_check.sizes_bytes", 4, 8 * kGiB, false, 64, "comm_check.sizes"},
      {"comm_check.iters", 1, 100000, true},
      {"comm_check.warmup", 0, 100000},
      {"comm_check.collectives", 0, 0, false, 16},
      {"comm_check.groups", 0, 0, false, 16},
      {"train.steps", 1, 1e8, true},
      {"train.lr", 1e-9, 10, true},
      {"train.min_lr", 0, 10},
      {"train.warmup_steps", 0, 1e8},
      {"train.weight_decay", 0, 10},
      {"train.clip_norm", -1, 1e6},
      {"train.seed", 0, 4611686018427387904.0},
      {"train.init_std", 1e-6, 10, true},
      {"train.data.digits", 1, 9, true},
      {"train.data.careless", 0, 1},
      {"train.data.calculator", 0, 1},
      {"train.checkpoint.save_every", 0, 1e8},
      {"train.checkpoint.keep", 0, 1e6},
      {"rl.group_size", 1, 4096, true},
      {"rl.prompts_per_step", 1, 1e6, true},
      {"rl.max_new_tokens", 1, 1048576, true},
      {"rl.temperature", 0.01, 100, true},
      {"rl.kl_coef", 0, 100},
      {"rl.clip", 1e-6, 1, true},
      {"rl.epochs", 1, 1000, true},
      {"rl.mini_batches", 1, 1e6, true},
      {"rl.max_tokens_per_micro_batch", 1, 1e9, true},
      {"rl.eval_every", 1, 1e6, true},
      {"rl.eval_problems", 1, 1e6, true},
      {"rl.reward_timeout_s", 0.001, 3600, true},
      {"rl.stop", 0, 0, false, 16},
      {"rl.entropy_coef", 0, 100},
      {"rl.gamma", 1e-6, 1, true},
      {"rl.gae_lambda", 1e-6, 1, true},
      {"rl.value_clip", 0, 100},
      {"rl.critic_lr", 0, 10},
      {"rl.kl_reward_coef", 0, 100},
      {"rl.gpu_memory_utilization", 0.01, 1, true},
      {"rl.clip_low", 1e-6, 1, true},
      {"rl.clip_high", 1e-6, 10, true},
      {"rl.dual_clip", 0, 100},
      {"rl.overlong_buffer", 0, 1048576},
      {"rl.overlong_penalty", 0, 100},
      {"rl.max_gen_batches", 1, 100, true},
      {"rl.tis_cap", 0, 1000},
      {"rl.max_staleness", 0, 1},
      {"rl.max_turns", 1, 64, true},
      {"rl.environment_timeout_s", 0.001, 3600, true},
      {"generate.max_new_tokens", 1, 1048576, true},
      {"generate.temperature", 0, 100},
      {"generate.top_k", 0, 1e8},
      {"generate.top_p", 1e-6, 1, true},
      {"generate.n", 1, 4096, true},
      {"generate.seed", 0, 4611686018427387904.0},
      {"generate.stop", 0, 0, false, 16},
      {"generate.max_running", 1, 65536, true},
      {"generate.cache_tokens", 1, 1099511627776.0, true},
  };
}

const std::map<std::string, const FieldLimit*>& Index() {
  static const auto* index = [] {
    auto* m = new std::map<std::string, const FieldLimit*>;
    for (const FieldLimit& f : JobSpecLimits()) (*m)[f.proto] = &f;
    return m;
  }();
  return *index;
}

bool IsNumeric(FieldDescriptor::CppType t) {
  return t == FieldDescriptor::CPPTYPE_INT32 || t == FieldDescriptor::CPPTYPE_INT64 ||
         t == FieldDescriptor::CPPTYPE_UINT32 || t == FieldDescriptor::CPPTYPE_UINT64 ||
         t == FieldDescriptor::CPPTYPE_DOUBLE || t == FieldDescriptor::CPPTYPE_FLOAT;
}

// "1e+08" reads badly in an error: integers as integers.
std::string Num(double v) {
  if (std::fabs(v) < 9e15 && v == std::floor(v)) return absl::StrCat(static_cast<int64_t>(v));
  if (int e = 0; v > 0 && std::frexp(v, &e) == 0.5) return absl::StrCat("2^", e - 1);
  return absl::StrFormat("%g", v);
}

// Calls fn(field, proto path, YAML path) for every field of JobSpec that is not a nested
// message (maps included), depth first; a repeated message adds "[]" to the YAML path.
void ForEachLeaf(const std::function<void(const FieldDescriptor*, const std::string&, const std::string&)>& fn) {
  std::function<void(const google::protobuf::Descriptor*, const std::string&, const std::string&)> walk =
      [&](const google::protobuf::Descriptor* d, const std::string& proto, const std::string& yaml) {
        for (int i = 0; i < d->field_count(); ++i) {
          const FieldDescriptor* f = d->field(i);
          const std::string fp = proto.empty() ? f->name() : absl::StrCat(proto, ".", f->name());
          const std::string fy = yaml.empty() ? f->name() : absl::StrCat(yaml, ".", f->name());
          if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map())
            walk(f->message_type(), fp, f->is_repeated() ? fy + "[]" : fy);
          else
            fn(f, fp, fy);
        }
      };
  walk(v1::JobSpec::descriptor(), "", "");
}

class Checker {
 public:
  absl::Status Walk(const Message& m, const std::string& proto, const std::string& yaml) {
    const auto* d = m.GetDescriptor();
    const Reflection* r = m.GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      const std::string fp = proto.empty() ? f->name() : absl::StrCat(proto, ".", f->name());
      const FieldLimit* lim = Find(fp);
      const std::string name = lim && lim->yaml ? lim->yaml : f->name();
      const std::string fy = lim && lim->yaml ? lim->yaml : (yaml.empty() ? name : absl::StrCat(yaml, ".", name));
      if (f->is_repeated()) {
        const int n = r->FieldSize(m, f);
        const int max_items = lim && lim->max_items > 0 ? lim->max_items : kMaxListItems;
        if (n > max_items) return Bad(fy, absl::StrCat("has ", n, " entries; at most ", max_items, " are allowed"));
        for (int k = 0; k < n; ++k) {
          const std::string ky = f->is_map() ? fy : absl::StrCat(fy, "[", k, "]");
          TESSERA_RETURN_IF_ERROR(Value(m, f, k, fp, ky, lim));
        }
      } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        if (r->HasField(m, f)) TESSERA_RETURN_IF_ERROR(Walk(r->GetMessage(m, f), fp, fy));
      } else {
        TESSERA_RETURN_IF_ERROR(Value(m, f, -1, fp, fy, lim));
      }
    }
    return absl::OkStatus();
  }

 private:
  static const FieldLimit* Find(const std::string& proto) {
    auto it = Index().find(proto);
    return it == Index().end() ? nullptr : it->second;
  }

  // Field f of m (element k of a repeated field, or -1).
  absl::Status Value(const Message& m, const FieldDescriptor* f, int k, const std::string& proto, const std::string& yaml,
                     const FieldLimit* lim) {
    const Reflection* r = m.GetReflection();
    const bool rep = k >= 0;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        const Message& sub = rep ? r->GetRepeatedMessage(m, f, k) : r->GetMessage(m, f);
        if (f->is_map()) {  // env: NAME -> value, both strings
          for (int i = 0; i < 2; ++i) {
            const FieldDescriptor* kv = sub.GetDescriptor()->field(i);
            const std::string s = sub.GetReflection()->GetString(sub, kv);
            if (s.size() > kMaxSpecStringBytes)
              return Bad(yaml, absl::StrCat("an entry's ", kv->name(), " is ", s.size(), " bytes; at most ",
                                            kMaxSpecStringBytes, " are allowed"));
          }
          return absl::OkStatus();
        }
        return Walk(sub, proto, yaml);
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        const std::string s = rep ? r->GetRepeatedString(m, f, k) : r->GetString(m, f);
        if (s.size() > kMaxSpecStringBytes)
          return Bad(yaml, absl::StrCat("is ", s.size(), " bytes long; at most ", kMaxSpecStringBytes, " are allowed"));
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const int v = rep ? r->GetRepeatedEnumValue(m, f, k) : r->GetEnumValue(m, f);
        if (f->enum_type()->FindValueByNumber(v) == nullptr)
          return Bad(yaml, absl::StrCat("unknown value ", v, " of ", f->enum_type()->name()));
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_BOOL:
        return absl::OkStatus();
      default:
        break;
    }
    if (lim == nullptr) return absl::InternalError(absl::StrCat(yaml, ": this build has no bound for the field"));
    double v = 0;
    bool integral = true;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: v = rep ? r->GetRepeatedInt32(m, f, k) : r->GetInt32(m, f); break;
      case FieldDescriptor::CPPTYPE_INT64: v = static_cast<double>(rep ? r->GetRepeatedInt64(m, f, k) : r->GetInt64(m, f)); break;
      case FieldDescriptor::CPPTYPE_UINT32: v = rep ? r->GetRepeatedUInt32(m, f, k) : r->GetUInt32(m, f); break;
      case FieldDescriptor::CPPTYPE_UINT64: v = static_cast<double>(rep ? r->GetRepeatedUInt64(m, f, k) : r->GetUInt64(m, f)); break;
      case FieldDescriptor::CPPTYPE_FLOAT: v = rep ? r->GetRepeatedFloat(m, f, k) : r->GetFloat(m, f); integral = false; break;
      default: v = rep ? r->GetRepeatedDouble(m, f, k) : r->GetDouble(m, f); integral = false; break;
    }
    return CheckNumber(*lim, yaml, v, integral);
  }

 public:
  static absl::Status CheckNumber(const FieldLimit& lim, const std::string& yaml, double v, bool integral) {
    if (!std::isfinite(v)) return Bad(yaml, "must be a finite number");
    if (lim.zero_default && v == 0) return absl::OkStatus();
    if (v >= lim.lo && v <= lim.hi) return absl::OkStatus();
    const double s = lim.scale;
    return Bad(yaml, absl::StrCat("must be in [", Num(lim.lo / s), ", ", Num(lim.hi / s), "]",
                                  lim.zero_default ? " (or 0: not given)" : "", ", got ",
                                  integral && s == 1 ? Num(v) : absl::StrFormat("%g", v / s)));
  }
};

}  // namespace

const std::vector<FieldLimit>& JobSpecLimits() {
  static const auto* table = new std::vector<FieldLimit>(MakeTable());
  return *table;
}

absl::Status CheckJobSpecLimits(const v1::JobSpec& spec) {
  const size_t bytes = spec.ByteSizeLong();
  if (bytes > kMaxJobSpecBytes)
    return Bad("job", absl::StrCat("the spec is ", bytes, " bytes; at most ", kMaxJobSpecBytes, " are allowed"));
  return Checker().Walk(spec, "", "");
}

absl::Status CheckJobSpecValue(const std::string& proto, const std::string& yaml, double v, bool integral) {
  auto it = Index().find(proto);
  if (it == Index().end()) return absl::OkStatus();
  const FieldLimit& lim = *it->second;
  if (lim.zero_default && v == 0 && std::isfinite(v)) {
    const double s = lim.scale;
    return Bad(yaml, absl::StrCat("must be in [", Num(lim.lo / s), ", ", Num(lim.hi / s),
                                  "]; leave the key out for the default"));
  }
  return Checker::CheckNumber(lim, yaml, v, integral);
}

std::vector<std::string> UnboundedJobSpecFields() {
  std::vector<std::string> out;
  ForEachLeaf([&](const FieldDescriptor* f, const std::string& proto, const std::string&) {
    if (IsNumeric(f->cpp_type()) && !Index().count(proto)) out.push_back(proto);
  });
  return out;
}

std::vector<JobSpecKey> JobSpecKeys() {
  // Keys a job file spells differently from the proto, or writes as something else.
  struct Spelling {
    const char* yaml;
    const char* type;
  };
  static const std::map<std::string, Spelling> kSpelling = {
      {"groups.device_type", {"groups[].device", "cpu or gpu"}},
      {"groups.placement", {"groups[].placement", "pack or spread"}},
      {"groups.layout.balance_stages", {"groups[].layout.stage_layers", "auto"}},
      {"comm_check.sizes_bytes", {"comm_check.sizes", "list of sizes (4KiB, 1MiB, 1GiB or bytes)"}},
      {"env", {"env", "map of string to string"}},
  };
  auto type_of = [](const FieldDescriptor* f) -> std::string {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_BOOL: return "bool";
      case FieldDescriptor::CPPTYPE_STRING: return "string";
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: return "number";
      case FieldDescriptor::CPPTYPE_ENUM: return "enum";
      default: return "integer";
    }
  };
  std::vector<JobSpecKey> out;
  ForEachLeaf([&](const FieldDescriptor* f, const std::string& fp, const std::string& fy) {
      auto lim_it = Index().find(fp);
      const FieldLimit* lim = lim_it == Index().end() ? nullptr : lim_it->second;
      JobSpecKey k{lim && lim->yaml ? lim->yaml : fy, fp, type_of(f), ""};
      if (lim && lim->scale != 1) k.type = "number";
      if (f->is_repeated() && !f->is_map()) k.type = "list of " + k.type;
      if (auto it = kSpelling.find(fp); it != kSpelling.end()) k.yaml = it->second.yaml, k.type = it->second.type;
      std::vector<std::string> b;
      if (IsNumeric(f->cpp_type()) && lim)
        b.push_back(absl::StrCat("[", Num(lim->lo / lim->scale), ", ", Num(lim->hi / lim->scale), "]",
                                 lim->zero_default ? ", or unset" : ""));
      if (f->is_repeated())
        b.push_back(absl::StrCat("at most ", lim && lim->max_items > 0 ? lim->max_items : kMaxListItems,
                                 f->is_map() ? " entries" : " items"));
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING || f->is_map())
        b.push_back(absl::StrCat("at most ", kMaxSpecStringBytes, " bytes", f->is_map() || f->is_repeated() ? " each" : ""));
      k.bounds = b.empty() ? "-" : absl::StrJoin(b, "; ");
      out.push_back(std::move(k));
  });
  return out;
}

}  // namespace tessera
