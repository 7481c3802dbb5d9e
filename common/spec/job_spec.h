// Job files: YAML <-> tessera.v1.JobSpec, `--set key=value` overrides, and the
// validation every submitted spec goes through (client side before submit, and
// again in the controller, which never trusts a client).
//
// Errors are INVALID_ARGUMENT and name the field by its path, e.g.
//   groups[0].layout.tp: expected an integer, got 'two'
#pragma once

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "common/parallel/layout.h"
#include "tessera/v1/cluster_service.pb.h"
#include "tessera/v1/common.pb.h"

namespace tessera {

// Parses a job file. `overrides` are "dotted.path=value" strings applied to the
// YAML tree before conversion; list items are addressed by index
// ("groups.0.devices=4") and values are parsed as YAML ("comm_check.sizes=[1KiB,1MiB]").
// Unknown keys and wrong types are errors.
absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml,
                                             const std::vector<std::string>& overrides = {});

// Fills defaults (placement PACK, layout dims of 1, dp derived from the device
// count, comm-check sizes) and checks every rule that needs no cluster knowledge:
// names, kinds, device counts, colocation, and the layout rules of docs/design.md §3.
absl::Status NormalizeAndValidateJobSpec(v1::JobSpec& spec);

// Paths a job reads or writes (train.checkpoint.dir, .load, train.export_hf,
// model.hf_dir) must lie under one of the
// controller's roots (--path-root); PERMISSION_DENIED naming the field otherwise. The
// controller checks this at submit; the syntax (absolute, no '..') is checked above.
absl::Status CheckJobPaths(const v1::JobSpec& spec, const std::vector<std::string>& roots);

// The same rule where the files are opened (executors, at every call): each path, its
// symbolic links resolved (the deepest existing ancestor through realpath; what does not
// exist yet as written), must lie under a root, itself resolved. A symlink under a root
// that leads out of it is PERMISSION_DENIED naming the field and where it leads.
absl::Status CheckJobPathsResolved(const v1::JobSpec& spec, const std::vector<std::string>& roots);
// `path` with the symbolic links of its deepest existing ancestor resolved.
std::string ResolvePath(const std::string& path);

// The path fields a spec sets, as (YAML field name, path): what the two checks above cover.
std::vector<std::pair<std::string, std::string>> JobPathFields(const v1::JobSpec& spec);

// The job kinds this build can run.
bool IsRunnableKind(absl::string_view kind);

// A grpo / ppo job's groups beside its actor (groups[0]), by role: at most one each.
// Null where the job has none — then the actor's own executors play the role.
//  - rollout: generation on a model of its own layout, on devices of its own (split
//    pools) or sharing the actor's (colocate_with: verl's resharding hybrid engine);
//  - reference: the frozen starting policy's log-probs (for the KL terms);
//  - critic (ppo): the value model, with its own optimizer and checkpoints.
const v1::GroupSpec* GroupWithRole(const v1::JobSpec& spec, absl::string_view role);
const v1::GroupSpec* RolloutPool(const v1::JobSpec& spec);  // GroupWithRole(spec, "rollout")
// The name of the group whose devices `group` runs on: its colocate_with, or itself.
std::string DevicesOf(const v1::JobSpec& spec, const std::string& group);

// The state as the CLI, logs, metrics labels and the dashboard show it: the enum value's
// name without its prefix ("RUNNING" for JOB_STATE_RUNNING; "UNKNOWN" outside the enum).
std::string JobStateName(v1::JobState s);
std::string NodeStateName(v1::NodeState s);
bool IsTerminal(v1::JobState s);

// The job spec's layout as the engine's struct.
parallel::Layout LayoutOf(const v1::ParallelLayout& l);

}  // namespace tessera
