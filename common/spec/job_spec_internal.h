// What common/spec/job_spec.cc (parsing) and common/spec/job_spec_validate.cc (normalizing and
// validating) share; not for other modules.
#pragma once
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera::job_spec_internal {

// INVALID_ARGUMENT "path: what": every refusal names the field.
inline absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

}  // namespace tessera::job_spec_internal
