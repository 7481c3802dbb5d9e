// Checkpoint save and load (CPU backend, f32): how long a checkpoint of a given model
// takes to write (safetensors + SHA-256 sidecars, fsync, commit) and to load back into a
// fresh model and trainer (verify, read, re-slice), and at what rate. `--dp N --zero Z`
// runs N data-parallel ranks as threads (Gloo over loopback), each loading what it holds;
// a phase's time is the slowest rank's. Prints one JSON line. The ~200M-parameter default
// fits this 24 GiB development machine at dp 1 and 2:
//   checkpoint_bench [--hidden 1024 --layers 8 --heads 16 --kv-heads 4 --ffn 4096
//                     --vocab 32000 --tied 0] [--dp 1 --zero 0] [--dir /tmp/tessera-ckpt-bench]
//                    [--repeat 2]
#include <barrier>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "bench/bench_util.h"
#include "common/status.h"
#include "common/util.h"
#include "tests/common/mem_store.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/train/trainer.h"
#include "worker/runtime/backend.h"

using namespace tessera;

namespace {
struct Rank {
  std::unique_ptr<runtime::Backend> be;
  std::unique_ptr<model::Llama> model;
  std::unique_ptr<engine::Trainer> trainer;
};

absl::StatusOr<Rank> MakeRank(const model::LlamaConfig& c, uint64_t seed, comm::Communicator* dp, int zero) {
  Rank r;
  TESSERA_ASSIGN_OR_RETURN(r.be, runtime::MakeBackend(runtime::Device::Cpu()));
  TESSERA_ASSIGN_OR_RETURN(r.model, model::Llama::Create(c, r.be.get()));
  TESSERA_RETURN_IF_ERROR(bench::Init(*r.model, seed));
  engine::OptimizerOptions o;
  o.zero = zero;
  TESSERA_ASSIGN_OR_RETURN(r.trainer, engine::Trainer::Create(r.model.get(), r.be.get(), dp, nullptr, o));
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
  const int dp = a.count("dp") ? std::atoi(a["dp"].c_str()) : 1, zero = a.count("zero") ? std::atoi(a["zero"].c_str()) : 0;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  testing::MemStore store;
  std::barrier sync(dp);
  std::vector<double> save_s(dp, 1e30), load_s(dp, 1e30);
  std::vector<absl::Status> status(dp);
  std::vector<std::thread> threads;
  for (int r = 0; r < dp; ++r)
    threads.emplace_back([&, r] {
      auto run = [&]() -> absl::Status {
        std::unique_ptr<comm::Communicator> comm;
        if (dp > 1) {
          TESSERA_ASSIGN_OR_RETURN(comm, comm::MakeGlooCommunicator("dp", "ckpt-bench/dp", r, dp, &store,
                                                                    {"127.0.0.1", 60000}));
        }
        TESSERA_ASSIGN_OR_RETURN(Rank src, MakeRank(c, 7, comm.get(), zero));
        TESSERA_ASSIGN_OR_RETURN(Rank dst, MakeRank(c, 8, comm.get(), zero));
        for (int i = 0; i < repeat; ++i) {
          sync.arrive_and_wait();
          auto t0 = std::chrono::steady_clock::now();
          TESSERA_RETURN_IF_ERROR(checkpoint::SaveCheckpoint(dir, i + 1, {src.model.get(), src.trainer.get(), nullptr, comm.get()}));
          sync.arrive_and_wait();  // every rank's save is committed
          save_s[r] = std::min(save_s[r], Since(t0));
          t0 = std::chrono::steady_clock::now();
          TESSERA_ASSIGN_OR_RETURN(std::string latest, checkpoint::LatestCheckpoint(dir));
          TESSERA_RETURN_IF_ERROR(
              checkpoint::LoadCheckpoint(latest, {dst.model.get(), dst.trainer.get(), nullptr, comm.get()}).status());
          load_s[r] = std::min(load_s[r], Since(t0));
        }
        // The load must have brought the weights and the moments over.
        for (size_t i = 0; i < src.model->params().size(); ++i) {
          TESSERA_ASSIGN_OR_RETURN(auto x, src.trainer->ReadPiece(i));
          TESSERA_ASSIGN_OR_RETURN(auto y, dst.trainer->ReadPiece(i));
          if (x.value != y.value || x.m != y.m || x.v != y.v)
            return absl::InternalError("the loaded state differs: " + src.model->params()[i].name());
        }
        return absl::OkStatus();
      };
      status[r] = run();
      if (!status[r].ok()) sync.arrive_and_drop();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < dp; ++r)
    if (!status[r].ok()) {
      fprintf(stderr, "checkpoint_bench: rank %d: %s\n", r, status[r].ToString().c_str());
      return 1;
    }
  uint64_t bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().string().find("step-00000001") != std::string::npos) bytes += e.file_size();
  const double save = *std::max_element(save_s.begin(), save_s.end()), load = *std::max_element(load_s.begin(), load_s.end());
  printf("{\"bench\": \"checkpoint\", \"params\": %lld, \"dp\": %d, \"zero\": %d, \"bytes\": %llu, \"save_s\": %.3f, "
         "\"save_gbps\": %.3f, \"load_s\": %.3f, \"load_gbps\": %.3f}\n",
         static_cast<long long>(c.NumParams()), dp, zero, static_cast<unsigned long long>(bytes), save, bytes / save / 1e9,
         load, bytes / load / 1e9);
  std::filesystem::remove_all(dir, ec);
  return 0;
}
