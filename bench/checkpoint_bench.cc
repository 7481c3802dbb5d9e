// Checkpoint save and load on one rank (CPU backend, f32): how long a checkpoint of a
// given model takes to write (safetensors + SHA-256 sidecars, fsync, commit) and to load
// back into a fresh model and trainer (verify, read, re-slice), and at what rate. Prints
// one JSON line. A ~200M-parameter default fits this 24 GiB development machine:
//   checkpoint_bench [--hidden 1024 --layers 8 --heads 16 --kv-heads 4 --ffn 4096
//                     --vocab 32000 --tied 0] [--dir /tmp/tessera-ckpt-bench] [--repeat 2]
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "bench/bench_util.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/engine/trainer.h"
#include "worker/runtime/backend.h"

using namespace tessera;

namespace {
struct Rank {
  std::unique_ptr<runtime::Backend> be;
  std::unique_ptr<model::Llama> model;
  std::unique_ptr<engine::Trainer> trainer;
};

absl::StatusOr<Rank> MakeRank(const model::LlamaConfig& c, uint64_t seed) {
  Rank r;
  TESSERA_ASSIGN_OR_RETURN(r.be, runtime::MakeBackend(runtime::Device::Cpu()));
  TESSERA_ASSIGN_OR_RETURN(r.model, model::Llama::Create(c, r.be.get()));
  TESSERA_RETURN_IF_ERROR(bench::Init(*r.model, seed));
  engine::OptimizerOptions o;
  TESSERA_ASSIGN_OR_RETURN(r.trainer, engine::Trainer::Create(r.model.get(), r.be.get(), nullptr, nullptr, o));
  return r;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  auto a = bench::Args(argc, argv);
  std::map<std::string, std::string> d = {{"hidden", "1024"}, {"layers", "8"}, {"heads", "16"}, {"kv-heads", "4"},
                                          {"ffn", "4096"},    {"vocab", "32000"}, {"tied", "0"}, {"dtype", "f32"}};
  for (auto& [k, v] : d) a.emplace(k, v);  // defaults where not given
  model::LlamaConfig c = bench::ConfigFromArgs(a);
  const std::string dir = a.count("dir") ? a["dir"] : "/tmp/tessera-ckpt-bench";
  const int repeat = a.count("repeat") ? std::atoi(a["repeat"].c_str()) : 2;
  auto fail = [](const absl::Status& s) {
    fprintf(stderr, "checkpoint_bench: %s\n", s.ToString().c_str());
    return 1;
  };
  auto src = MakeRank(c, 7);
  if (!src.ok()) return fail(src.status());
  auto dst = MakeRank(c, 8);
  if (!dst.ok()) return fail(dst.status());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  double save_s = 1e30, load_s = 1e30;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (auto s = checkpoint::SaveCheckpoint(dir, i + 1, {src->model.get(), src->trainer.get()}); !s.ok()) return fail(s);
    save_s = std::min(save_s, Since(t0));
    t0 = std::chrono::steady_clock::now();
    auto latest = checkpoint::LatestCheckpoint(dir);
    if (!latest.ok()) return fail(latest.status());
    auto step = checkpoint::LoadCheckpoint(*latest, {dst->model.get(), dst->trainer.get()});
    if (!step.ok()) return fail(step.status());
    load_s = std::min(load_s, Since(t0));
  }
  uint64_t bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().string().find("step-00000001") != std::string::npos) bytes += e.file_size();
  // The load must have brought the weights over.
  auto& ps = src->model->params();
  auto& pd = dst->model->params();
  for (size_t i = 0; i < ps.size(); ++i) {
    auto x = src->model->GatherGlobal(ps[i], false), y = dst->model->GatherGlobal(pd[i], false);
    if (!x.ok() || !y.ok() || *x != *y) return fail(absl::InternalError("the loaded weights differ: " + ps[i].name()));
  }
  printf("{\"bench\": \"checkpoint\", \"params\": %lld, \"bytes\": %llu, \"save_s\": %.3f, \"save_gbps\": %.3f, "
         "\"load_s\": %.3f, \"load_gbps\": %.3f}\n",
         static_cast<long long>(c.NumParams()), static_cast<unsigned long long>(bytes), save_s, bytes / save_s / 1e9,
         load_s, bytes / load_s / 1e9);
  std::filesystem::remove_all(dir, ec);
  return 0;
}
