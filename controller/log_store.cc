#include "controller/log_store.h"

#include <dirent.h>

#include <algorithm>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/util.h"

namespace tessera::controller {

std::string LogStore::PathOf(const std::string& job_id, int attempt, int executor) const {
  return absl::StrCat(dir_, "/", job_id, "/attempt-", attempt, "/executor-", executor, ".log");
}

void LogStore::Append(const std::string& job_id, int attempt, int executor, const std::string& node_id,
                      const std::vector<std::string>& lines) {
  if (!IsSafeName(job_id) || !IsSafeName(node_id)) return;  // never a path outside dir_ (callers check too)
  std::lock_guard<std::mutex> l(mu_);
  std::string dir = absl::StrCat(dir_, "/", job_id, "/attempt-", attempt);
  (void)MakeDirs(dir);
  std::string node_file = absl::StrCat(dir, "/executor-", executor, ".node");
  {
    std::ifstream in(node_file);
    if (!in) std::ofstream(node_file) << node_id;
  }
  std::ofstream out(PathOf(job_id, attempt, executor), std::ios::app);
  for (const auto& line : lines) out << line << '\n';
}

std::vector<LogStore::Cursor> LogStore::List(const std::string& job_id, int attempt, int executor) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<Cursor> out;
  if (!IsSafeName(job_id)) return out;
  std::string jdir = absl::StrCat(dir_, "/", job_id);
  DIR* d = opendir(jdir.c_str());
  if (!d) return out;
  std::vector<int> attempts;
  while (dirent* e = readdir(d)) {
    int a;
    std::string n = e->d_name;
    if (n.rfind("attempt-", 0) == 0 && absl::SimpleAtoi(n.substr(8), &a)) attempts.push_back(a);
  }
  closedir(d);
  std::sort(attempts.begin(), attempts.end());
  for (int a : attempts) {
    if (attempt > 0 && a != attempt) continue;
    std::string adir = absl::StrCat(jdir, "/attempt-", a);
    DIR* ad = opendir(adir.c_str());
    if (!ad) continue;
    std::vector<int> execs;
    while (dirent* e = readdir(ad)) {
      std::string n = e->d_name;
      int x;
      if (n.rfind("executor-", 0) == 0 && n.size() > 13 && n.substr(n.size() - 4) == ".log" &&
          absl::SimpleAtoi(n.substr(9, n.size() - 13), &x))
        execs.push_back(x);
    }
    closedir(ad);
    std::sort(execs.begin(), execs.end());
    for (int x : execs) {
      if (executor >= 0 && x != executor) continue;
      Cursor c{a, x, "", 0};
      std::ifstream nf(absl::StrCat(adir, "/executor-", x, ".node"));
      std::getline(nf, c.node_id);
      out.push_back(c);
    }
  }
  return out;
}

std::vector<v1::LogLine> LogStore::ReadNew(const std::string& job_id, Cursor& c, size_t max_lines) {
  std::vector<v1::LogLine> out;
  std::ifstream in(PathOf(job_id, c.attempt, c.executor), std::ios::binary);
  if (!in) return out;
  in.seekg(c.offset);
  std::string line;
  while (out.size() < max_lines && std::getline(in, line)) {
    if (in.eof()) break;  // a partial last line: read it once it is complete
    c.offset = static_cast<int64_t>(in.tellg());
    v1::LogLine ll;
    ll.set_executor(c.executor);
    ll.set_attempt(c.attempt);
    ll.set_node_id(c.node_id);
    ll.set_text(line);
    out.push_back(std::move(ll));
  }
  return out;
}

std::vector<v1::LogLine> LogStore::Tail(const std::string& job_id, const Cursor& c, size_t max_lines) {
  constexpr int64_t kWindow = 256 << 10;
  Cursor at = c;
  std::ifstream in(PathOf(job_id, c.attempt, c.executor), std::ios::binary | std::ios::ate);
  if (!in) return {};
  const int64_t size = static_cast<int64_t>(in.tellg());
  const int64_t start = std::max<int64_t>(0, size - kWindow);
  at.offset = start;
  std::vector<v1::LogLine> lines = ReadNew(job_id, at, static_cast<size_t>(kWindow));
  if (start > 0 && !lines.empty()) lines.erase(lines.begin());  // began mid-line
  if (lines.size() > max_lines) lines.erase(lines.begin(), lines.end() - static_cast<std::ptrdiff_t>(max_lines));
  return lines;
}

}  // namespace tessera::controller
