// Runs a Hugging Face model directory through the engine for bench/hf_fidelity.py, which
// compares the results with transformers on the same directory (a GPU host):
//   hf_model_run [--tp=N] DIR OUT DEVICE DTYPE TOKENS [GREEDY_PROMPT GREEDY_N]
// --tp=N: tensor parallelism over N processes (rank r on GPU r, NCCL, a file store in a
// temporary directory), each importing only its slices; the logits' vocabulary shards
// are joined into logits.f32 after the ranks exit.
// DEVICE: cpu | cuda; DTYPE: f32 | bf16 (mixed precision); TOKENS and GREEDY_PROMPT: files
// of little-endian i32 ids. Writes into OUT: logits.f32 ([T, vocab] of the sequence at
// positions 0..T-1), grad.NAME.f32 for the parameters of kGradNames (of the mean
// next-token cross-entropy), greedy.i32 (GREEDY_N tokens of greedy decoding through the
// rollout engine after the prompt); prints one JSON line of timings. A critic's or a
// reward model's directory (*ForTokenClassification, *ForSequenceClassification) writes
// values.f32 instead ([T]: the value head at every position; a reward model's score is
// the last) and nothing else.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/util.h"
#include "tests/common/file_store.h"
#include "worker/checkpoint/hf.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/model/llama.h"
#include "worker/rollout/rollout.h"

using namespace tessera;

namespace {
const char* const kGradNames[] = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                                  "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.q_norm.weight",
                                  "model.layers.1.mlp.down_proj.weight", "model.norm.weight"};

std::vector<int32_t> ReadIds(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<int32_t> v;
  int32_t x;
  while (f.read(reinterpret_cast<char*>(&x), 4)) v.push_back(x);
  return v;
}
template <typename T>
bool Write(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  return static_cast<bool>(f);
}
int Fail(const absl::Status& s) {
  fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}
double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

// One rank's run (tp: null for one process); rank 0 writes the outputs and prints.
int RunRank(int argc, char** argv, comm::Communicator* tp) {
  const int rank = tp != nullptr ? tp->rank() : 0;
  const std::string dir = argv[1], out = argv[2], device = argv[3], dtype = argv[4];
  auto config = model::ReadHfConfig(dir);
  if (!config.ok()) return Fail(config.status());
  config->dtype = dtype == "bf16" ? DType::kBF16 : DType::kF32;
  std::unique_ptr<runtime::Backend> backend = runtime::MakeCpuBackend();
  if (device == "cuda") {
    auto gpu = runtime::MakeCudaBackend(rank);
    if (!gpu.ok()) return Fail(gpu.status());
    backend = std::move(*gpu);
  }
  // The TP group's collectives wait for the compute enqueued before them, and compute for them.
  if (tp != nullptr)
    if (auto st = tp->OrderWith(backend->stream()); !st.ok()) return Fail(st);
  auto m = model::Llama::Create(*config, backend.get(), tp);
  if (!m.ok()) return Fail(m.status());
  model::Llama& model = **m;
  auto t0 = std::chrono::steady_clock::now();
  if (auto st = checkpoint::ImportHf(dir, model); !st.ok()) return Fail(st);  // compute copies refreshed too
  const double load_s = Since(t0);
  const std::vector<int32_t> tokens = ReadIds(argv[5]);
  const model::TokenBatch b = model::TokenBatch::NextTokenSequence(tokens);
  t0 = std::chrono::steady_clock::now();
  if (config->value_head) {
    auto values = model.TokenValues(b);
    if (!values.ok()) return Fail(values.status());
    const double forward_s = Since(t0);
    if (rank == 0 && !Write(out + "/values.f32", *values)) return Fail(absl::InternalError("cannot write values"));
    if (rank == 0) printf("%s\n", nlohmann::json{{"tp", tp != nullptr ? tp->size() : 1}, {"load_s", load_s}, {"forward_s", forward_s}}.dump().c_str());
    return 0;
  }
  auto logits = model.ForwardLogits(b);
  if (!logits.ok()) return Fail(logits.status());
  const double forward_s = Since(t0);
  const std::string logits_file = tp != nullptr ? absl::StrCat(out, "/logits.rank", rank, ".f32") : out + "/logits.f32";
  if (!Write(logits_file, *logits)) return Fail(absl::InternalError("cannot write logits"));
  if (auto st = model.ZeroGrads(); !st.ok()) return Fail(st);
  auto loss = model.ForwardBackward(b, 1.f / static_cast<float>(tokens.size() - 1));
  if (!loss.ok()) return Fail(loss.status());
  for (const char* name : kGradNames) {
    model::Param* p = model.Find(name);
    if (p == nullptr) continue;
    if (auto st = model.FreshenGrad(*p); !st.ok()) return Fail(st);
    auto g = model.GatherGlobal(*p, /*grad=*/true);
    if (!g.ok()) return Fail(g.status());
    if (rank == 0 && !Write(out + "/grad." + name + ".f32", *g)) return Fail(absl::InternalError("cannot write a gradient"));
  }
  double greedy_s = 0;
  if (argc == 8) {
    engine::RolloutOptions o;
    o.block_size = 16, o.num_blocks = 64, o.max_running = 1;
    auto e = engine::RolloutEngine::Create(&model, o);
    if (!e.ok()) return Fail(e.status());
    engine::GenerationRequest r;
    r.prompt = ReadIds(argv[6]);
    r.params.temperature = 0;
    r.params.max_new_tokens = std::stoll(argv[7]);
    t0 = std::chrono::steady_clock::now();
    auto got = (*e)->Generate({r});
    if (!got.ok()) return Fail(got.status());
    greedy_s = Since(t0);
    if (rank == 0 && !Write(out + "/greedy.i32", (*got)[0].tokens)) return Fail(absl::InternalError("cannot write greedy tokens"));
  }
  if (rank != 0) return 0;
  printf("%s\n", nlohmann::json{{"tp", tp != nullptr ? tp->size() : 1}, {"load_s", load_s}, {"forward_s", forward_s}, {"greedy_s", greedy_s},
                                {"loss_sum", loss->sum}, {"loss_tokens", loss->tokens}}
                     .dump()
                     .c_str());
  return 0;
}

int main(int argc, char** argv) {
  int tp = 1;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]).rfind("--tp=", 0) == 0) tp = std::stoi(argv[i] + 5);
    else args.push_back(argv[i]);
  }
  const int n = static_cast<int>(args.size());
  if ((n != 6 && n != 8) || tp < 1) {
    fprintf(stderr, "usage: hf_model_run [--tp=N] DIR OUT cpu|cuda f32|bf16 TOKENS [GREEDY_PROMPT GREEDY_N]\n");
    return 2;
  }
  if (tp == 1) return RunRank(n, args.data(), nullptr);
  if (std::string(args[3]) != "cuda") {
    fprintf(stderr, "hf_model_run: --tp needs cuda\n");
    return 2;
  }
  char tmpl[] = "/tmp/hf_model_run.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Fail(absl::InternalError("mkdtemp failed"));
  const std::string store_dir = tmpl;
  std::vector<pid_t> pids;
  fflush(stdout), fflush(stderr);
  for (int r = 0; r < tp; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      testing::FileStore store(store_dir);
      auto c = comm::MakeNcclCommunicator("tp", "hf_model_run", r, tp, &store, comm::NcclOptions{r});
      const int rc = c.ok() ? RunRank(n, args.data(), c->get()) : Fail(c.status());
      fflush(stdout), fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  (void)system(("rm -rf " + store_dir).c_str());
  if (failed > 0) return Fail(absl::InternalError(absl::StrCat(failed, " of ", tp, " ranks failed")));
  // Join the ranks' vocabulary shards: [T, vocab / tp] each -> [T, vocab].
  const std::string out = args[2];
  std::vector<std::vector<float>> shards(tp);
  for (int r = 0; r < tp; ++r) {
    std::ifstream f(absl::StrCat(out, "/logits.rank", r, ".f32"), std::ios::binary | std::ios::ate);
    shards[r].resize(static_cast<size_t>(f.tellg()) / 4);
    f.seekg(0);
    f.read(reinterpret_cast<char*>(shards[r].data()), static_cast<std::streamsize>(shards[r].size() * 4));
    std::remove(absl::StrCat(out, "/logits.rank", r, ".f32").c_str());
  }
  const size_t t = ReadIds(args[5]).size(), v = shards[0].size() / t;
  std::vector<float> logits(t * v * tp);
  for (size_t i = 0; i < t; ++i)
    for (int r = 0; r < tp; ++r) std::copy_n(shards[r].data() + i * v, v, logits.data() + (i * tp + r) * v);
  if (!Write(out + "/logits.f32", logits)) return Fail(absl::InternalError("cannot write logits"));
  return 0;
}
