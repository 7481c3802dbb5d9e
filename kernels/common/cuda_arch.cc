#include "kernels/common/cuda_arch.h"

#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#ifndef TESSERA_CUDA_ARCHS
#define TESSERA_CUDA_ARCHS ""
#endif

namespace tessera::kernels {

absl::string_view BuiltCudaArchitectures() { return TESSERA_CUDA_ARCHS; }

namespace {
struct Arch {
  int cc = 0;             // 90 for 9.0
  char suffix = 0;  // 'a': this capability only; 'f': its family (same major, this minor or later)
  bool real = true, virt = true;
};

bool Parse(absl::string_view s, Arch* a) {
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) a->cc = a->cc * 10 + (s[i++] - '0');
  if (i == 0 || a->cc < 10) return false;
  if (i < s.size() && (s[i] == 'a' || s[i] == 'f')) a->suffix = s[i++];
  const absl::string_view rest = s.substr(i);
  if (rest == "-real") {
    a->virt = false;
  } else if (rest == "-virtual") {
    a->real = false;
  } else if (!rest.empty()) {
    return false;
  }
  return true;
}
}  // namespace

absl::Status CheckComputeCapability(absl::string_view archs, int device, absl::string_view name, int major, int minor) {
  const int cc = major * 10 + minor;
  std::vector<std::string> listed;
  for (absl::string_view e : absl::StrSplit(archs, absl::ByAnyChar(",;"), absl::SkipWhitespace())) {
    Arch a;
    if (!Parse(e, &a)) return absl::OkStatus();  // "native", "all": the build's list is not known here
    listed.push_back(absl::StrCat(a.real ? "sm_" : "compute_", e.substr(0, e.find('-'))));
    const bool same_family = major == a.cc / 10 && minor >= a.cc % 10;
    bool runs;
    if (a.suffix == 'a') {
      runs = cc == a.cc;  // sm_90a / compute_90a: that GPU alone
    } else if (a.suffix == 'f') {
      runs = same_family;
    } else {
      runs = (a.real && same_family) || (a.virt && cc >= a.cc);
    }
    if (runs) return absl::OkStatus();
  }
  if (listed.empty()) return absl::OkStatus();  // nothing to check against
  return absl::FailedPreconditionError(absl::StrCat(
      "CUDA device ", device, " (", name, ") is compute capability ", major, ".", minor, "; this build's kernels are for ",
      absl::StrJoin(listed, ", "), " (TESSERA_CUDA_ARCHITECTURES ", archs,
      "), which it cannot run; build with its architecture in -DTESSERA_CUDA_ARCHITECTURES"));
}

bool HopperKernels(absl::string_view archs, int major, int minor) {
  if (major != 9 || minor != 0) return false;
  for (absl::string_view e : absl::StrSplit(archs, absl::ByAnyChar(",;"), absl::SkipWhitespace())) {
    Arch a;
    if (Parse(e, &a) && a.cc == 90 && a.suffix == 'a') return true;
  }
  return false;
}

}  // namespace tessera::kernels
