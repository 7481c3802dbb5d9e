// The training oracle's ranks as processes (tests/gpu/trainer_gpu_test; trainer_test checks
// it on the CPU): each rank of a layout is a child process (on its own GPU there), as
// executors run (docs/design.md §1), communicators bootstrapped through a directory store
// (tests/common/file_store.h).
//
// Why not threads: every CUDA context of a process shares its module loader. A kernel
// library that cuBLASLt or cuDNN loads at the first use of a shape goes into every
// context of the process (CUDA_MODULE_LOADING=EAGER) and waits for each to drain — and a
// collective spinning on another rank's device waits for this rank's matching call. tp2 x
// pp2 in bf16 hung so on one run and passed on the next (4x H200), and train_bench's dp2
// hung until its ranks became processes. No context is shared between processes.
//
// CUDA cannot be used in a child forked after the parent initialized it: a GPU test's
// parent never touches CUDA (trainer_gpu_test counts the GPUs in a child).
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "tests/common/file_store.h"
#include "tests/worker/train/layout_harness.h"

namespace tessera::engine::test {

inline void WriteTrace(const Trace& t, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  auto u64 = [&](uint64_t v) { f.write(reinterpret_cast<const char*>(&v), sizeof v); };
  for (const auto* v : {&t.losses, &t.norms}) {
    u64(v->size());
    f.write(reinterpret_cast<const char*>(v->data()), static_cast<std::streamsize>(v->size() * sizeof(double)));
  }
  u64(t.weights.size());
  for (const auto& [name, w] : t.weights) {
    u64(name.size());
    f.write(name.data(), static_cast<std::streamsize>(name.size()));
    u64(w.size());
    f.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * sizeof(float)));
  }
}

inline bool ReadTrace(const std::string& path, Trace& t) {
  std::ifstream f(path, std::ios::binary);
  auto u64 = [&]() {
    uint64_t v = 0;
    f.read(reinterpret_cast<char*>(&v), sizeof v);
    return f && v < (1ull << 32) ? v : 0;
  };
  for (auto* v : {&t.losses, &t.norms}) {
    v->resize(u64());
    f.read(reinterpret_cast<char*>(v->data()), static_cast<std::streamsize>(v->size() * sizeof(double)));
  }
  for (uint64_t n = u64(); f && n > 0; --n) {
    std::string name(u64(), '\0');
    f.read(name.data(), static_cast<std::streamsize>(name.size()));
    std::vector<float> w(u64());
    f.read(reinterpret_cast<char*>(w.data()), static_cast<std::streamsize>(w.size() * sizeof(float)));
    t.weights[name] = std::move(w);
  }
  return static_cast<bool>(f);
}

// The factory of a rank's communicators, given the store every process of the run shares.
using MakeCommWithStore = std::function<MakeComm(comm::KvStore* store)>;

// Every rank of the layout in its own process (rank r on GPU r through make_backend);
// their traces in rank order. A rank that fails an assertion (its messages are printed by
// the child), exits otherwise or outlives `timeout_s` fails the calling test, naming it;
// the others are then stopped.
inline std::vector<Trace> RunLayoutInProcesses(const Layout& l, const model::LlamaConfig& config,
                                               const MakeCommWithStore& make_comm, const MakeBackend& make_backend,
                                               const Hyper& h = {}, int timeout_s = 120) {
  char tmpl[] = "/tmp/trainer_gpu_test.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    return {};
  }
  const std::string dir = tmpl, key = RandomHex(4);
  const int world = l.world();
  std::vector<pid_t> pids(world, -1);
  fflush(stdout), fflush(stderr);
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      // The rank's own failures, whatever reporter the parent had installed: printed here,
      // told to the parent by the exit code.
      ::testing::TestPartResultArray failures;
      Trace t;
      {
        ::testing::ScopedFakeTestPartResultReporter mine(
            ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &failures);
        testing::FileStore store(dir);
        RunRank(l, config, r, make_comm(&store), make_backend, h, key, t);
      }
      for (int i = 0; i < failures.size(); ++i) {
        const ::testing::TestPartResult& f = failures.GetTestPartResult(i);
        fprintf(stderr, "%s rank %d: %s:%d: %s\n", l.name, r, f.file_name() ? f.file_name() : "?", f.line_number(),
                f.message());
      }
      if (failures.size() == 0) WriteTrace(t, absl::StrCat(dir, "/trace.", r));
      fflush(stdout), fflush(stderr);
      _exit(failures.size() == 0 ? 0 : 1);
    }
    if (pid < 0) ADD_FAILURE() << "fork failed for rank " << r;
    pids[r] = pid;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool stopped = false;
  for (int left = world; left > 0;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid == 0) {
      if (!stopped && std::chrono::steady_clock::now() > deadline) {
        for (int r = 0; r < world; ++r)
          if (pids[r] > 0) {
            ADD_FAILURE() << l.name << " rank " << r << " still running after " << timeout_s << " s: stopped";
            kill(pids[r], SIGKILL);
          }
        stopped = true;  // the loop reaps them
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (pid < 0) break;
    int r = 0;
    while (r < world && pids[r] != pid) ++r;
    if (r == world) continue;
    pids[r] = -1, --left;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ADD_FAILURE() << l.name << " rank " << r << " failed ("
                    << (WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status))
                                            : absl::StrCat("exit ", WEXITSTATUS(status)))
                    << ")";
      for (pid_t other : pids)
        if (other > 0) kill(other, SIGKILL);  // it would wait for the failed rank's collectives
    }
  }
  std::vector<Trace> traces(world);
  for (int r = 0; r < world; ++r) ReadTrace(absl::StrCat(dir, "/trace.", r), traces[r]);
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  return traces;
}

}  // namespace tessera::engine::test
