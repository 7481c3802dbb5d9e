// The bounds of every field of a JobSpec, as one table applied to the proto itself: a
// spec built by any client (the YAML parser, a hand-made SubmitJob request, a fuzzer)
// meets the same rules. NormalizeAndValidateJobSpec (common/spec/job_spec.h) checks them
// first, before any arithmetic on the values.
//
// Every numeric field has a range (0, where the proto documents 0 as "the default", is
// allowed beside it), every double must be finite, every enum a declared value, every
// string and list a bounded size, the whole spec at most kMaxJobSpecBytes serialized.
// Refusals are INVALID_ARGUMENT naming the field by its YAML path (e.g.
// `groups[1].layout.tp: must be in [1, 1024] (or 0: the default), got 4096`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tessera/v1/common.pb.h"

namespace tessera {

inline constexpr size_t kMaxJobSpecBytes = 1 << 20;     // serialized JobSpec (and a job file's text)
inline constexpr size_t kMaxSpecStringBytes = 4096;     // any string field (paths, names, stops...)
inline constexpr int kMaxListItems = 64;                // any repeated field without its own bound
// Bounds on products of fields (checked by NormalizeAndValidateJobSpec).
inline constexpr int64_t kMaxVirtualStages = 4096;       // pp x vpp
inline constexpr int64_t kMaxMicroBatchTokens = 1 << 24;  // micro_batch x seq_len
inline constexpr int64_t kMaxStepTokens = int64_t{1} << 31;  // global_batch x seq_len
inline constexpr int64_t kMaxRlSamples = 1 << 20;        // rl.prompts_per_step x rl.group_size

// One field's rule. `proto` is the field's path in the proto without list indices
// ("groups.layout.tp"); `yaml` the job file's key for it where that differs
// ("collective_timeout_s" for collective_timeout_ms), shown in errors and docs with
// values divided by `scale`. Numbers lie in [lo, hi], or are 0 where `zero_default`.
// Strings are at most `hi` bytes; `max_items` bounds a repeated field's length.
struct FieldLimit {
  const char* proto;
  double lo = 0, hi = 0;
  bool zero_default = false;
  int max_items = 0;  // 0: kMaxListItems
  const char* yaml = nullptr;
  double scale = 1;
};

// The table (docs/jobs.md lists every key with its bounds).
const std::vector<FieldLimit>& JobSpecLimits();

// Checks `spec` against the table. Fields the table does not name (strings, bools) get
// the generic bounds above.
absl::Status CheckJobSpecLimits(const v1::JobSpec& spec);

// One value a job file gives explicitly (the YAML parser refuses it before building the
// proto, with the same message): its range, and for a field where 0 means "not given",
// a written 0 is refused too ("leave the key out for the default"). OK for a field the
// table does not name.
absl::Status CheckJobSpecValue(const std::string& proto, const std::string& yaml, double v, bool integral);

// One job-file key, for the reference of every key (docs/jobs.md, which a unit test
// holds to this list): its YAML path (`groups[].layout.tp`), the proto field it sets
// (`groups.layout.tp`), its type as a job file writes it, and its bounds from the table
// (`[1, 1024], or unset`; `at most 64 items`; `at most 4096 bytes`).
struct JobSpecKey {
  std::string yaml, proto, type, bounds;
};
std::vector<JobSpecKey> JobSpecKeys();

// The numeric fields of JobSpec (by proto path) that have no entry in the table: empty
// unless a field was added to the proto without a bound (a unit test keeps it empty).
std::vector<std::string> UnboundedJobSpecFields();

}  // namespace tessera
