// Bearer tokens with roles for clients (admin > submit > read), and the checks
// the gRPC handlers make. Tokens are compared in constant time and never logged.
//
// Threading: immutable after Load/Add* during startup; then read-only and safe
// to call from any thread.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

enum class Role { kRead = 1, kSubmit = 2, kAdmin = 3 };
const char* RoleName(Role r);
absl::StatusOr<Role> ParseRole(const std::string& s);

struct Principal {
  std::string name;
  Role role = Role::kRead;
};

class TokenAuthority {
 public:
  void AddToken(const std::string& token, Role role, const std::string& name);
  // File format: one "ROLE NAME TOKEN" per line; '#' starts a comment.
  absl::Status LoadFile(const std::string& path);
  // UNAUTHENTICATED when the token is missing or unknown; PERMISSION_DENIED when
  // its role is below `need`.
  absl::StatusOr<Principal> Check(const std::string& token, Role need) const;

 private:
  struct Entry {
    std::string token;
    Principal who;
  };
  std::vector<Entry> entries_;
};

}  // namespace tessera
