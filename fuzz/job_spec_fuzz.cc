// The job-spec parser and validator (common/spec/job_spec.h) on arbitrary YAML: any input is
// accepted or refused with a status — never a crash, a hang or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/spec/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = tessera::ParseJobSpecYaml(text, {});
  if (spec.ok()) {
    (void)tessera::NormalizeAndValidateJobSpec(*spec);
    (void)tessera::CheckJobPaths(*spec, {"/data"});
  }
  return 0;
}
