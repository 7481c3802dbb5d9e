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
// A directory that holds secrets (the controller's state dir, an agent's work dir): it
// must belong to this user (FAILED_PRECONDITION naming `what` otherwise), and loses any
// group and other permissions it has. True when it had to be tightened.
absl::StatusOr<bool> TightenPrivateDir(const std::string& path, absl::string_view what);

// A name safe as one path component and in a certificate: 1..max_len characters of
// letters, digits, '-', '_' and '.', starting with a letter or digit (so never "." or
// ".."). Node ids and job ids are such names.
bool IsSafeName(absl::string_view s, size_t max_len = 253);

// "1KiB", "4MiB", "1GiB", "1024", "2k" -> bytes.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text);
std::string FormatBytes(int64_t bytes);

// Directory of the running executable (/proc/self/exe).
std::string SelfExeDir();

}  // namespace tessera
