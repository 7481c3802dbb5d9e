#include "common/util.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t MonoMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string RandomHex(int bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), bytes) != 1) {
    // RAND_bytes only fails if the OS entropy source is broken; fall back to urandom.
    std::ifstream in("/dev/urandom", std::ios::binary);
    in.read(raw.data(), bytes);
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view data, int mode) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  // O_NOFOLLOW: a symbolic link planted at the temporary name is not written through.
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", strerror(errno)));
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", strerror(e)));
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot sync ", tmp, ": ", strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", strerror(e)));
  }
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& path, int mode) {
  if (path.empty()) return absl::OkStatus();
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      cur = path.substr(0, i);
      if (!cur.empty() && ::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST)
        return absl::InternalError(absl::StrCat("cannot create directory ", cur, ": ", strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> TightenPrivateDir(const std::string& path, absl::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return absl::FailedPreconditionError(absl::StrCat(what, " ", path, ": ", strerror(errno)));
  if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(what, " ", path, " is not a directory"));
  if (st.st_uid != ::geteuid())
    return absl::FailedPreconditionError(absl::StrCat(what, " ", path, " belongs to uid ", st.st_uid, ", not to this user (uid ",
                                                      ::geteuid(), "); it holds secrets: use a directory of this user's"));
  if ((st.st_mode & 077) == 0) return false;
  if (::chmod(path.c_str(), st.st_mode & 0700) != 0)
    return absl::FailedPreconditionError(absl::StrCat(what, " ", path, " is open to other users (mode ",
                                                      absl::StrFormat("%o", st.st_mode & 0777), ") and cannot be made 0700: ",
                                                      strerror(errno)));
  return true;
}

bool IsSafeName(absl::string_view s, size_t max_len) {
  if (s.empty() || s.size() > max_len || !absl::ascii_isalnum(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
  return true;
}

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  std::string t(absl::StripAsciiWhitespace(text));
  size_t i = 0;
  while (i < t.size() && (isdigit(static_cast<unsigned char>(t[i])))) ++i;
  if (i == 0) return absl::InvalidArgumentError(absl::StrCat("'", t, "' is not a byte size (e.g. 4096, 64KiB, 1MiB, 1GiB)"));
  int64_t n = 0;
  if (!absl::SimpleAtoi(t.substr(0, i), &n))
    return absl::InvalidArgumentError(absl::StrCat("'", t, "' is not a byte size"));
  std::string unit = absl::AsciiStrToLower(t.substr(i));
  int64_t mul = 1;
  if (unit.empty() || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kib" || unit == "kb") mul = 1LL << 10;
  else if (unit == "m" || unit == "mib" || unit == "mb") mul = 1LL << 20;
  else if (unit == "g" || unit == "gib" || unit == "gb") mul = 1LL << 30;
  else return absl::InvalidArgumentError(absl::StrCat("'", t, "': unknown unit '", unit, "' (use B, KiB, MiB or GiB)"));
  if (n > (int64_t{1} << 40) / mul) return absl::InvalidArgumentError(absl::StrCat("'", t, "' is larger than 1 TiB"));
  return n * mul;
}

std::string FormatBytes(int64_t b) {
  if (b >= (1LL << 30) && b % (1LL << 30) == 0) return absl::StrCat(b >> 30, "GiB");
  if (b >= (1LL << 20) && b % (1LL << 20) == 0) return absl::StrCat(b >> 20, "MiB");
  if (b >= (1LL << 10) && b % (1LL << 10) == 0) return absl::StrCat(b >> 10, "KiB");
  return absl::StrCat(b, "B");
}

std::string SelfExeDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, n);
  auto pos = p.rfind('/');
  return pos == std::string::npos ? "." : p.substr(0, pos);
}

}  // namespace tessera
