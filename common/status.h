// Status helpers: early-return macros and error context. absl only, no gRPC: every layer,
// the kernels included, uses it.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#define TESSERA_CONCAT_INNER(a, b) a##b
#define TESSERA_CONCAT(a, b) TESSERA_CONCAT_INNER(a, b)

#define TESSERA_RETURN_IF_ERROR(expr)            \
  do {                                           \
    ::absl::Status _st = (expr);                 \
    if (!_st.ok()) return _st;                   \
  } while (0)

#define TESSERA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(*tmp)

#define TESSERA_ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL(TESSERA_CONCAT(_statusor_, __LINE__), lhs, expr)

namespace tessera {

// Prefixes the message of a non-OK status with context, keeping its code.
inline absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), std::string(context) + ": " + std::string(s.message()));
}

}  // namespace tessera
