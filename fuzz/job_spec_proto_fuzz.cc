// Structure-aware fuzzing of JobSpec messages — what any gRPC client may send to SubmitJob,
// not only what the YAML parser makes — through everything the controller does with a
// spec before an executor runs: validation, path checks, admission (the training plan),
// placement on a cluster, and the worker groups' setup (every parallel group of every
// rank's layout, the pipeline's layer split, the driver's WorkerGroup). Whatever the
// input: a status, never a crash, a hang, an overflow or undefined behaviour.
//
// Inputs are serialized JobSpecs. The custom mutator parses one, changes one field by
// reflection to a value chosen to hit edges (bounds and one past them, 0, -1, extremes,
// NaN and infinities, unknown enum values, the names the validator knows, long strings,
// lists grown or cut), and serializes it again; seeds are the example job files
// (`fuzz_job_spec_seeds` writes them from examples/).
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/spec/job_spec.h"
#include "common/spec/job_spec_limits.h"
#include "controller/admission.h"
#include "controller/driver/worker_group.h"
#include "controller/scheduler.h"
#include "common/plan/plan_spec.h"
#include "common/parallel/layout.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using tessera::v1::JobSpec;

// A cluster of three nodes (8 CPU slots and 8 GPUs each; one draining, one half busy).
std::vector<tessera::controller::NodeView> Cluster() {
  std::vector<tessera::controller::NodeView> nodes;
  for (int n = 0; n < 3; ++n) {
    tessera::controller::NodeView v;
    v.node_id = "n" + std::to_string(n);
    v.schedulable = n != 2;
    for (int i = 0; i < 16; ++i) v.devices.push_back({i < 8 ? tessera::v1::DEVICE_TYPE_CPU : tessera::v1::DEVICE_TYPE_GPU, i % 8, !(n == 1 && i % 2)});
    nodes.push_back(v);
  }
  return nodes;
}

class NoExecutor final : public tessera::controller::ExecutorClient {
 public:
  absl::StatusOr<tessera::v1::InitGroupResponse> InitGroup(const tessera::v1::InitGroupRequest&, int64_t) override {
    return absl::UnavailableError("none");
  }
  absl::Status Shutdown(int64_t) override { return absl::OkStatus(); }
  void Cancel() override {}
};

// What the controller and the executors set up for one group of a valid spec.
void SetUpGroup(const tessera::v1::JobSpec& spec, const tessera::v1::GroupSpec& g) {
  const tessera::parallel::Layout l = tessera::LayoutOf(g.layout());
  if (l.world() != g.devices()) __builtin_trap();  // the validator promised this
  for (auto kind : tessera::parallel::kAllGroupKinds) {
    const auto groups = tessera::parallel::BuildGroups(l, kind);
    for (int rank : {0, l.world() - 1}) (void)tessera::parallel::GroupOf(l, kind, rank);
    (void)groups;
  }
  if (spec.model().num_layers() > 0)
    for (int r = 0; r < l.pp; ++r) (void)tessera::parallel::LayersOfRank(l, spec.model().num_layers(), r);
  std::vector<std::shared_ptr<tessera::controller::ExecutorClient>> ranks(
      static_cast<size_t>(g.devices()), std::make_shared<NoExecutor>());
  tessera::controller::WorkerGroup wg(g.name(), l, ranks, spec.collective_timeout_ms() * 4 + 60000);
  (void)wg.size();
}

void Exercise(JobSpec spec) {
  if (!tessera::NormalizeAndValidateJobSpec(spec).ok()) return;
  JobSpec again = spec;  // a validated spec validates again, unchanged (the controller re-checks stored ones)
  if (!tessera::NormalizeAndValidateJobSpec(again).ok()) __builtin_trap();
  (void)tessera::CheckJobPaths(spec, {"/data"});
  const std::string& kind = spec.kind();
  if (kind == "pretrain" || kind == "sft" || kind == "grpo" || kind == "ppo") {
    if (spec.model().hf_dir().empty()) {
      const auto in = tessera::plan::PlanInputOf(spec);
      (void)tessera::plan::PlanTraining(in);
      if (in.layout.pp > 1) (void)tessera::plan::BalanceStages(in);
    }
    (void)tessera::controller::CheckPlanFits(spec, int64_t{80} << 30);
  }
  const auto nodes = Cluster();
  (void)tessera::controller::Place(spec, nodes, /*only_free=*/true);
  auto placed = tessera::controller::Place(spec, nodes, /*only_free=*/false);
  for (const auto& g : spec.groups()) SetUpGroup(spec, g);
  (void)placed;
}

// ------------------------------------------------------------------ the mutator

// Every field of the message tree, set or not (a field's parent message on the way).
struct Site {
  Message* msg;
  const FieldDescriptor* field;
};
void Sites(Message* m, std::vector<Site>* out, int depth = 0) {
  const auto* d = m->GetDescriptor();
  const auto* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    out->push_back({m, f});
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || f->is_map() || depth > 4) continue;
    if (f->is_repeated()) {
      for (int k = 0; k < r->FieldSize(*m, f) && k < 4; ++k) Sites(r->MutableRepeatedMessage(m, f, k), out, depth + 1);
    } else if (r->HasField(*m, f)) {
      Sites(r->MutableMessage(m, f), out, depth + 1);
    }
  }
}

int64_t Interesting(std::mt19937_64& rng, const FieldDescriptor* f, const Message& m) {
  std::vector<int64_t> v = {0, 1, -1, 2, 3, 4, 7, 8, 16, 64, 255, 256, 1023, 1024, 1025, 4096, 4097, 65535, 65536, 65537,
                            1 << 20, (1 << 20) + 1, 1 << 24, (1 << 24) + 1, std::numeric_limits<int32_t>::max(),
                            std::numeric_limits<int32_t>::min(), int64_t{1} << 40};
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT64 || f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
    v.push_back(std::numeric_limits<int64_t>::max());
    v.push_back(std::numeric_limits<int64_t>::min());
    v.push_back(int64_t{1} << 62);
  }
  // The table's bounds for this field, and one past them.
  std::string path = f->name();
  for (const auto* d = f->containing_type(); d != JobSpec::descriptor();) {
    const FieldDescriptor* parent = nullptr;
    for (const auto* top : {JobSpec::descriptor(), tessera::v1::GroupSpec::descriptor(), tessera::v1::TrainSpec::descriptor()})
      for (int i = 0; i < top->field_count(); ++i)
        if (top->field(i)->message_type() == d) parent = top->field(i);
    if (parent == nullptr) break;
    path = parent->name() + "." + path;
    d = parent->containing_type();
  }
  for (const auto& lim : tessera::JobSpecLimits())
    if (path == lim.proto)
      for (double b : {lim.lo, lim.hi}) {
        v.push_back(static_cast<int64_t>(b));
        v.push_back(static_cast<int64_t>(b) + 1);
        v.push_back(static_cast<int64_t>(b) - 1);
      }
  (void)m;
  if (rng() % 4 == 0) return static_cast<int64_t>(rng() % 100000) - 10;
  return v[rng() % v.size()];
}

double InterestingDouble(std::mt19937_64& rng) {
  const double v[] = {0, 1, -1, 0.5, 1e-9, 1e-6, 2, 10, 100, 3600, 86400, 1e12, 1e300, -1e300,
                      std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                      -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::denorm_min(), -0.0};
  return v[rng() % (sizeof(v) / sizeof(v[0]))];
}

std::string InterestingString(std::mt19937_64& rng) {
  static const char* kWords[] = {"", "pretrain", "sft", "grpo", "ppo", "generate", "comm-check", "evaluate", "actor",
                                 "rollout", "reference", "critic", "worker", "w", "auto", "1f1b", "gpipe", "bf16",
                                 "f32", "jsonl", "arithmetic", "byte", "/data/x", "/data/../etc", "relative/path",
                                 "/data/ck", "\n", "all_reduce", "tp", "dp", "world", "NCCL_DEBUG", "LD_PRELOAD",
                                 "127.0.0.1:7000", "-x", "..", "a b"};
  if (rng() % 8 == 0) return std::string(rng() % 5000, 'a' + rng() % 26);
  return kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
}

void Mutate(std::mt19937_64& rng, JobSpec* spec) {
  std::vector<Site> sites;
  Sites(spec, &sites);
  const Site s = sites[rng() % sites.size()];
  Message* m = s.msg;
  const FieldDescriptor* f = s.field;
  const auto* r = m->GetReflection();
  if (f->is_repeated()) {
    const int n = r->FieldSize(*m, f);
    if (n > 0 && rng() % 3 == 0) {
      r->RemoveLast(m, f);
      return;
    }
    const int add = rng() % 8 == 0 ? 1 + rng() % 64 : 1;
    for (int k = 0; k < add; ++k) {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32: r->AddInt32(m, f, static_cast<int32_t>(Interesting(rng, f, *m))); break;
        case FieldDescriptor::CPPTYPE_INT64: r->AddInt64(m, f, Interesting(rng, f, *m)); break;
        case FieldDescriptor::CPPTYPE_STRING: r->AddString(m, f, InterestingString(rng)); break;
        case FieldDescriptor::CPPTYPE_ENUM: r->AddEnumValue(m, f, static_cast<int>(rng() % 4)); break;
        case FieldDescriptor::CPPTYPE_MESSAGE: {
          Message* sub = r->AddMessage(m, f);
          if (f->is_map()) {
            sub->GetReflection()->SetString(sub, sub->GetDescriptor()->field(0), InterestingString(rng));
            sub->GetReflection()->SetString(sub, sub->GetDescriptor()->field(1), InterestingString(rng));
          } else if (n > 0 && rng() % 2) {
            sub->CopyFrom(r->GetRepeatedMessage(*m, f, static_cast<int>(rng() % n)));
          }
          break;
        }
        default: break;
      }
    }
    return;
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, static_cast<int32_t>(Interesting(rng, f, *m))); break;
    case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, Interesting(rng, f, *m)); break;
    case FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, static_cast<uint64_t>(Interesting(rng, f, *m))); break;
    case FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, static_cast<uint32_t>(Interesting(rng, f, *m))); break;
    case FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, InterestingDouble(rng)); break;
    case FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, static_cast<float>(InterestingDouble(rng))); break;
    case FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, !r->GetBool(*m, f)); break;
    case FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, InterestingString(rng)); break;
    case FieldDescriptor::CPPTYPE_ENUM: r->SetEnumValue(m, f, static_cast<int>(rng() % 5) - 1); break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      if (r->HasField(*m, f) && rng() % 3 == 0) r->ClearField(m, f);
      else r->MutableMessage(m, f);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  JobSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return 0;
  Exercise(std::move(spec));
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::mt19937_64 rng(seed);
  JobSpec spec;
  if (rng() % 8 == 0 || !spec.ParseFromArray(data, static_cast<int>(size)))
    return LLVMFuzzerMutate(data, size, max_size);  // bytes, now and then: wire-format edge cases
  const int steps = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < steps; ++i) Mutate(rng, &spec);
  const std::string out = spec.SerializeAsString();
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::copy(out.begin(), out.end(), data);
  return out.size();
}
