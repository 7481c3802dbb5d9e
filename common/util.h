// Small utilities: time, random ids, constant-time comparison, files.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

int64_t NowMs();
// Monotonic milliseconds, for deadlines and timeouts.
int64_t MonoMs();

// `bytes` cryptographically random bytes, hex encoded.
std::string RandomHex(int bytes);

// Compares secrets without an early exit that would leak the matching prefix length.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

absl::StatusOr<std::string> ReadFile(const std::string& path);
// Writes to path.tmp, fsyncs, renames over path: readers see the old or the new file.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view data, int mode = 0644);
absl::Status MakeDirs(const std::string& path, int mode = 0755);

// "1KiB", "4MiB", "1GiB", "1024", "2k" -> bytes.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text);
std::string FormatBytes(int64_t bytes);

// Directory of the running executable (/proc/self/exe).
std::string SelfExeDir();

}  // namespace tessera
