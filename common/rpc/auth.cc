#include "common/rpc/auth.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/util.h"

namespace tessera {

const char* RoleName(Role r) {
  switch (r) {
    case Role::kRead: return "read";
    case Role::kSubmit: return "submit";
    case Role::kAdmin: return "admin";
  }
  return "?";
}

absl::StatusOr<Role> ParseRole(const std::string& s) {
  if (s == "read") return Role::kRead;
  if (s == "submit") return Role::kSubmit;
  if (s == "admin") return Role::kAdmin;
  return absl::InvalidArgumentError(absl::StrCat("unknown role '", s, "'; expected read, submit or admin"));
}

void TokenAuthority::AddToken(const std::string& token, Role role, const std::string& name) {
  entries_.push_back({token, {name, role}});
}

absl::Status TokenAuthority::LoadFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() != 3)
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": expected 'ROLE NAME TOKEN'"));
    auto role = ParseRole(f[0]);
    if (!role.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": ", role.status().message()));
    if (f[2].size() < 16)
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": token of '", f[1], "' is shorter than 16 characters"));
    AddToken(f[2], *role, f[1]);
  }
  return absl::OkStatus();
}

absl::StatusOr<Principal> TokenAuthority::Check(const std::string& token, Role need) const {
  if (token.empty())
    return absl::UnauthenticatedError("no bearer token; pass --token or set TESSERA_TOKEN");
  const Principal* found = nullptr;
  for (const auto& e : entries_)  // no early exit: every comparison is made
    if (ConstantTimeEquals(e.token, token) && !found) found = &e.who;
  if (!found) return absl::UnauthenticatedError("the bearer token is not valid");
  if (static_cast<int>(found->role) < static_cast<int>(need))
    return absl::PermissionDeniedError(absl::StrCat("token '", found->name, "' has role ", RoleName(found->role),
                                                    "; this call needs ", RoleName(need)));
  return *found;
}

}  // namespace tessera
