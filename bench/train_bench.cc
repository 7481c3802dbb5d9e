// Training throughput of the engine on one or more GPUs of one host (bench/llama_train_peer.py
// is the PyTorch peer — DDP / FSDP2 under torchrun —, run in the same call by
// `scripts/gpu-bench.sh train` and `scale`): a Llama of the given shape, random tokens (fixed seed), per DP
// rank `--micro` micro-batches per step (weak scaling), each of `--mbs` (default 1) packed
// `--seq`-token sequences (per-document causal attention, positions from 0 in each),
// `--tp`, `--dp`, `--zero`, `--sp`, `--pp` (with `--vpp`, `--schedule 1f1b|gpipe`) as a
// job's layout (a process per rank and GPU, as executors run; NCCL bootstrapped through a
// directory store; every pipeline stage runs all `--micro`
// micro-batches, and the measured bubble is printed: the slowest stage's schedule time
// over the stages' mean compute time, minus 1, against (pp - 1) / (vpp * micro));
// AdamW; `--warmup` untimed steps, then `--steps` timed ones (each step ends on the host:
// the loss is read; the slowest rank's time counts; the clock starts and stops with the
// device idle, so every timed step's update is timed and nothing before them is). Prints
// one JSON line: tokens/s, step ms, model TFLOP/s in all and per GPU (Megatron's
// 6 N per token + causal attention 6 L Hq D s^2, the formula the pretrain driver
// reports), peak memory, the model states each rank holds after the last step (the
// allocator's bytes in use) beside the plan's (common/plan) and, in mixed precision with DP,
// ZeRO's formula for them, the losses.
//
// --recompute-swiglu 1: the SwiGLU output rebuilt by the backward, not kept (Llama::set_recompute_swiglu);
// --last-stage-layers N: N layers on the last virtual stage (ParallelLayout.last_stage_layers);
// --stage-layers A,B,...|auto: every virtual stage's layers (ParallelLayout.stage_layers;
//   auto: the balanced split, as a job's `stage_layers: auto`);
// --gemm-tune 1: each GEMM shape's first call times cuBLASLt's candidates and keeps the
//   fastest (kernels::SetGemmTuning; the warmup steps pay for it);
// --trace PREFIX: each rank's GPU timeline (kernels, copies, memsets, and its "timed step"
//   ranges) from CUPTI into PREFIX.rank<r>.csv (bench/cupti_trace.h), for bench/nsys_gaps.py
//   where Nsight Systems cannot trace CUDA.
//   train_bench --hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256
//               --seq 4096 --micro 4 --steps 10 --warmup 3 [--tied 1] [--dtype bf16] [--recompute 0]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sstream>

#include <nvtx3/nvToolsExt.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/cupti_trace.h"
#include "common/plan/plan.h"
#include "kernels/gemm/gemm.h"
#include "tests/common/file_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/train/trainer.h"
#include "common/parallel/layout.h"

using namespace tessera;
using bench::Args;
using bench::Init;

namespace {

struct Result {
  absl::Status status;
  std::vector<double> losses;
  std::vector<double> pipeline_s, busy_s;  // per timed step (pipelines)
  double dp_wait_s = 0;                     // summed over timed steps (StepStats::dp_wait_s)
  // The DP communicator's host time in device collectives (their enqueue) and in host
  // collectives (which wait for the group's stream), and its calls, summed over timed
  // steps: a slow enqueue can starve the GPU where the host is not ahead.
  double dp_host_s = 0, dp_host_op_s = 0, dp_calls = 0;
  double seconds = 0, peak_gib = 0;
  double states_gib = 0;  // held after the last step: the model states (and any caches)
};

// A rank's result through a pipe to the parent: "<code> <seconds> <peak> <states> <dp wait>
// <dp host> <dp host ops> <dp calls>", the
// three series (count, values), then the status message.
std::string Encode(const Result& r) {
  std::ostringstream o;
  o.precision(17);
  o << static_cast<int>(r.status.code()) << ' ' << r.seconds << ' ' << r.peak_gib << ' ' << r.states_gib << ' ' << r.dp_wait_s << ' '
    << r.dp_host_s << ' ' << r.dp_host_op_s << ' ' << r.dp_calls;
  for (const auto* v : {&r.losses, &r.pipeline_s, &r.busy_s}) {
    o << ' ' << v->size();
    for (double x : *v) o << ' ' << x;
  }
  o << ' ' << r.status.message();
  return o.str();
}

Result Decode(const std::string& text, int rank) {
  Result r;
  std::istringstream in(text);
  int code = -1;
  in >> code >> r.seconds >> r.peak_gib >> r.states_gib >> r.dp_wait_s >> r.dp_host_s >> r.dp_host_op_s >> r.dp_calls;
  for (auto* v : {&r.losses, &r.pipeline_s, &r.busy_s}) {
    size_t n = 0;
    in >> n;
    v->resize(in ? n : 0);
    for (double& x : *v) in >> x;
  }
  std::string message;
  std::getline(in, message);
  if (!in && code < 0) {
    r.status = absl::InternalError(absl::StrCat("rank ", rank, " exited without a result"));
  } else if (code != 0) {
    r.status = absl::Status(static_cast<absl::StatusCode>(code), message.empty() ? message : message.substr(1));
  }
  return r;
}

struct Layout {
  int tp = 1, dp = 1, pp = 1, vpp = 1, zero = 0, last_stage_layers = 0;
  std::vector<int> stage_layers;  // --stage-layers 3,2,2,1,...
  bool sp = false, recompute = false, recompute_swiglu = false;
  parallel::Schedule schedule = parallel::Schedule::kOneFOneB;
};

// One rank: its model, trainer and data (`micro` micro-batches of its DP rank).
void RunRank(const model::LlamaConfig& c, int device, comm::Communicator* tp, comm::Communicator* dp,
             comm::Communicator* pp, const Layout& l, int64_t seq, int64_t mbs, int64_t micro, int64_t steps, int64_t warmup,
             int dp_rank, bench::CuptiTrace* trace, Result& out) {
  auto fail = [&](absl::Status s) { out.status = std::move(s); };
  auto be = runtime::MakeCudaBackend(device);
  if (!be.ok()) return fail(be.status());
  for (comm::Communicator* g : {tp, dp, pp})
    if (g != nullptr)
      if (auto s = g->OrderWith((*be)->stream()); !s.ok()) return fail(s);
  const model::StageSpec stage{l.pp, pp != nullptr ? pp->rank() : 0, l.vpp, l.last_stage_layers, l.stage_layers};
  auto m = model::Llama::Create(c, be->get(), tp, l.sp, nullptr, stage);
  if (!m.ok()) return fail(m.status());
  if (auto s = Init(**m, 7); !s.ok()) return fail(s);
  (*m)->set_recompute(l.recompute);
  (*m)->set_recompute_swiglu(l.recompute_swiglu);
  engine::OptimizerOptions o;
  o.lr = 3e-4f, o.min_lr = 3e-5f, o.warmup_steps = 2, o.total_steps = warmup + steps, o.clip_norm = 1.f;
  o.weight_decay = 0.1f, o.zero = l.zero, o.schedule = l.schedule;
  auto t = engine::Trainer::Create(m->get(), be->get(), dp, tp, o, pp);
  if (!t.ok()) return fail(t.status());
  std::mt19937_64 rng(11 + dp_rank);
  std::vector<model::TokenBatch> batches(micro);
  for (auto& b : batches) {
    b.cu_seqlens = {0};
    for (int64_t d = 0; d < mbs; ++d) {
      const int64_t at = static_cast<int64_t>(b.tokens.size());
      for (int64_t i = 0; i < seq; ++i) b.tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
      for (int64_t i = 0; i < seq; ++i) b.targets.push_back(i + 1 < seq ? b.tokens[at + i + 1] : -1);
      for (int64_t i = 0; i < seq; ++i) b.positions.push_back(static_cast<int32_t>(i));
      b.cu_seqlens.push_back(static_cast<int32_t>(at + seq));
    }
  }
  std::chrono::steady_clock::time_point t0;
  comm::CommStats dp0;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    if (s == warmup) {
      if (auto st = (*be)->Synchronize(); !st.ok()) return fail(st);  // the warmup's last update
      (*be)->allocator()->ResetPeak();
      t0 = std::chrono::steady_clock::now();
      if (dp != nullptr) dp0 = dp->stats();
    }
    nvtxRangePushA(s >= warmup ? "timed step" : "warmup step");  // for bench/nsys_gaps.py
    const uint64_t begin = trace != nullptr ? trace->Now() : 0;
    auto st = (*t)->Step(batches);
    if (trace != nullptr) trace->Range(s >= warmup ? "timed step" : "warmup step", begin, trace->Now());
    nvtxRangePop();
    if (!st.ok()) return fail(st.status());
    out.losses.push_back(st->loss);
    if (s >= warmup) out.pipeline_s.push_back(st->pipeline_s), out.busy_s.push_back(st->pipeline_busy_s);
    if (s >= warmup) out.dp_wait_s += st->dp_wait_s;
  }
  if (auto st = (*be)->Synchronize(); !st.ok()) return fail(st);  // the last step's update, still on the device
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (dp != nullptr)
    out.dp_host_op_s = dp->stats().host_op_seconds - dp0.host_op_seconds,
    out.dp_host_s = dp->stats().seconds - dp0.seconds - out.dp_host_op_s,
    out.dp_calls = double(dp->stats().calls - dp0.calls);
  out.peak_gib = (*be)->allocator()->stats().peak_bytes / double(1 << 30);
  out.states_gib = (*be)->allocator()->stats().current_bytes / double(1 << 30);
}

}  // namespace

int main(int argc, char** argv) {
  // As the executor (worker/main.cc): every kernel loaded when CUDA starts, so no lazy load
  // waits for a device where a pipeline's receive is spinning.
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  auto a = Args(argc, argv);
  auto get = [&](const char* k, int64_t d) { return a.count(k) ? std::atoll(a[k].c_str()) : d; };
  model::LlamaConfig c = bench::ConfigFromArgs(a);
  const int64_t seq = get("seq", 4096), micro = get("micro", 4), steps = get("steps", 10), warmup = get("warmup", 3),
                mbs = get("mbs", 1);
  if (mbs < 1) {
    fprintf(stderr, "--mbs: sequences per micro-batch must be at least 1, got %lld\n", static_cast<long long>(mbs));
    return 2;
  }
  Layout l;
  l.tp = static_cast<int>(get("tp", 1)), l.dp = static_cast<int>(get("dp", 1)), l.zero = static_cast<int>(get("zero", 0));
  l.pp = static_cast<int>(get("pp", 1)), l.vpp = static_cast<int>(get("vpp", 1));
  l.last_stage_layers = static_cast<int>(get("last-stage-layers", 0));
  if (a.count("stage-layers") && a["stage-layers"] == "auto") {  // as a job's `stage_layers: auto`
    l.stage_layers = parallel::BalancedStageLayers(
        c.layers, l.pp, l.vpp, parallel::LlamaStageCosts(c.hidden, c.heads, c.kv_heads, c.HeadDim(), c.ffn, c.vocab, seq));
  } else if (a.count("stage-layers")) {
    for (auto part : absl::StrSplit(a["stage-layers"], ',')) l.stage_layers.push_back(std::atoi(std::string(part).c_str()));
  }
  l.sp = get("sp", 0) != 0, l.recompute = get("recompute", 0) != 0;
  l.recompute_swiglu = get("recompute-swiglu", 0) != 0;
  if (a.count("schedule")) {
    auto sch = parallel::ParseSchedule(a["schedule"]);
    if (!sch.ok()) {
      fprintf(stderr, "%s\n", sch.status().ToString().c_str());
      return 2;
    }
    l.schedule = *sch;
  }
  const int tp = l.tp, dp = l.dp, pp = l.pp, zero = l.zero;
  const bool sp = l.sp;
  const int world = tp * dp * pp;
  // A process per rank, one GPU each (as executors: nothing of CUDA shared between
  // ranks — with ranks as threads of one process, a library cuDNN loads while building a
  // plan goes into every device's context, and waits for devices where collectives spin).
  // NCCL groups through a directory store; rank = tp_rank + tp * (dp_rank + dp * pp_rank).
  char dir_template[] = "/tmp/train_bench.XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    perror("mkdtemp");
    return 1;
  }
  const std::string dir = dir_template;
  const int64_t nccl_timeout_ms = get("nccl-timeout-ms", 120000);
  if (a.count("gemm-tune")) kernels::SetGemmTuning(a["gemm-tune"] == "1");
  std::vector<pid_t> pids(world, -1);
  std::vector<int> pipes(world, -1);
  for (int r = 0; r < world; ++r) {
    int fd[2];
    if (pipe(fd) != 0) {
      perror("pipe");
      return 1;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) {  // the rank
      close(fd[0]);
      tessera::testing::FileStore store(dir);
      Result res;
      std::unique_ptr<bench::CuptiTrace> trace;  // before this rank's first CUDA call
      if (a.count("trace")) {
        auto started = bench::CuptiTrace::Start();
        if (started.ok()) trace = std::move(*started);
        else res.status = started.status();
      }
      const int tpr = r % tp, dpr = (r / tp) % dp, ppr = r / (tp * dp);
      std::unique_ptr<comm::Communicator> tpc, dpc, ppc;
      auto make = [&](const std::string& name, int rank, int size, std::unique_ptr<comm::Communicator>& out) {
        if (size == 1) return absl::OkStatus();
        comm::NcclOptions no{r, nccl_timeout_ms};
        auto cm = comm::MakeNcclCommunicator(name, name, rank, size, &store, no);
        if (!cm.ok()) return cm.status();
        out = std::move(*cm);
        return absl::OkStatus();
      };
      if (res.status.ok()) res.status = make(absl::StrCat("tp", dpr, "_", ppr), tpr, tp, tpc);
      if (res.status.ok()) res.status = make(absl::StrCat("dp", tpr, "_", ppr), dpr, dp, dpc);
      if (res.status.ok()) res.status = make(absl::StrCat("pp", tpr, "_", dpr), ppr, pp, ppc);
      if (res.status.ok()) RunRank(c, r, tpc.get(), dpc.get(), ppc.get(), l, seq, mbs, micro, steps, warmup, dpr, trace.get(), res);
      if (res.status.ok() && trace != nullptr) {
        std::string summary;
        const std::string path = absl::StrCat(a["trace"], ".rank", r, ".csv");
        res.status = trace->Write(path, &summary);
        if (res.status.ok()) fprintf(stderr, "rank %d: trace %s: %s\n", r, path.c_str(), summary.c_str());
      }
      if (!res.status.ok()) fprintf(stderr, "rank %d: %s\n", r, res.status.ToString().c_str());
      const std::string text = Encode(res);
      for (size_t done = 0; done < text.size();) {
        const ssize_t n = write(fd[1], text.data() + done, text.size() - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      close(fd[1]);
      _exit(res.status.ok() ? 0 : 1);  // no static destructors racing the driver's teardown
    }
    close(fd[1]);
    pids[r] = pid, pipes[r] = fd[0];
  }
  // Results as ranks finish; the first failure stops the others (they would wait for it
  // in a collective until the NCCL watchdog fires).
  std::vector<Result> results(world);
  std::vector<std::string> text(world);
  for (int left = world; left > 0; --left) {
    int wstatus = 0;
    const pid_t pid = wait(&wstatus);
    int r = 0;
    while (r < world && pids[r] != pid) ++r;
    if (r == world) continue;
    char buf[4096];
    for (ssize_t n; (n = read(pipes[r], buf, sizeof buf)) > 0;) text[r].append(buf, static_cast<size_t>(n));
    close(pipes[r]);
    pids[r] = -1;
    if (!(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0))
      for (pid_t other : pids)
        if (other > 0) kill(other, SIGKILL);
  }
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  for (int r = 0; r < world; ++r) results[r] = Decode(text[r], r);
  double secs = 0, peak = 0, states = 0, dp_wait = 0, dp_host = 0, dp_host_op = 0, dp_calls = 0;
  bool failed = false;
  for (int r = 0; r < world; ++r)
    if (!results[r].status.ok()) {
      fprintf(stderr, "rank %d: %s\n", r, results[r].status.ToString().c_str());
      failed = true;
    }
  if (failed) return 1;
  for (int r = 0; r < world; ++r) {
    secs = std::max(secs, results[r].seconds), peak = std::max(peak, results[r].peak_gib);
    states = std::max(states, results[r].states_gib);
    dp_wait = std::max(dp_wait, results[r].dp_wait_s);
    dp_host = std::max(dp_host, results[r].dp_host_s), dp_calls = std::max(dp_calls, results[r].dp_calls);
    dp_host_op = std::max(dp_host_op, results[r].dp_host_op_s);
  }
  const std::vector<double>& losses = results[world - 1].losses;  // every rank has the loss
  // The bubble of each timed step over the first pipeline (tp rank 0, dp rank 0).
  // Also each stage's mean schedule and compute time (imbalance shows there).
  double bubble = 0;
  std::vector<double> stage_ms(pp, 0.0), busy_ms(pp, 0.0);
  for (int64_t s = 0; pp > 1 && s < steps; ++s) {
    double slowest = 0, busy = 0;
    for (int p = 0; p < pp; ++p) {
      const Result& st = results[p * tp * dp];
      slowest = std::max(slowest, st.pipeline_s[s]), busy += st.busy_s[s] / pp;
      stage_ms[p] += 1e3 * st.pipeline_s[s] / steps, busy_ms[p] += 1e3 * st.busy_s[s] / steps;
    }
    bubble += (slowest / busy - 1) / steps;
  }
  std::string stages;
  for (int p = 0; pp > 1 && p < pp; ++p)
    absl::StrAppend(&stages, p ? ", " : "", "[", absl::StrFormat("%.2f, %.2f", stage_ms[p], busy_ms[p]), "]");
  // The plan's model states per rank (common/plan: without the block buffers ZeRO-2/3 hold
  // only while a block runs) and, in mixed precision, ZeRO's formula for them.
  plan::PlanInput pin{c, parallel::Layout{tp, 1, dp, pp, l.vpp, sp, zero, l.last_stage_layers, l.stage_layers}, seq, mbs,
                      micro * mbs * dp, l.recompute};
  pin.recompute_swiglu = l.recompute_swiglu, pin.schedule = l.schedule;
  double plan_states = 0, plan_total = 0, formula = 0;
  if (auto pl = plan::PlanTraining(pin); pl.ok()) {
    const double gib = 1 << 30, phi = double(pl->params_per_rank), n = dp;
    plan_states = (pl->memory.states() - pl->memory.block_buffers) / gib, plan_total = pl->memory.total() / gib;
    if (c.dtype != tessera::DType::kF32 && dp > 1)
      formula = (zero == 0 ? 18 * phi : zero == 1 ? 6 * phi + 12 * phi / n : zero == 2 ? 2 * phi + 16 * phi / n : 18 * phi / n) / gib;
  } else {
    fprintf(stderr, "plan: %s\n", pl.status().ToString().c_str());
  }
  const double tokens = double(steps) * micro * mbs * seq * dp;
  const double flops = 6.0 * double(c.NumParams()) * tokens + 6.0 * c.layers * c.heads * c.HeadDim() * double(seq) * seq * micro * mbs * dp * steps;
  printf("{\"impl\": \"tessera\", \"dtype\": \"%s\", \"tp\": %d, \"dp\": %d, \"pp\": %d, \"vpp\": %d, \"schedule\": \"%s\", "
         "\"bubble\": %.4f, \"bubble_ideal\": %.4f, \"stage_ms_busy_ms\": [%s], \"zero\": %d, \"sp\": %d, \"params\": %lld, "
         "\"seq\": %lld, \"mbs\": %lld, \"micro\": %lld, \"steps\": %lld, \"step_ms\": %.2f, \"tokens_per_s\": %.1f, \"tflops\": %.2f, "
         "\"tflops_per_gpu\": %.2f, \"peak_gib\": %.2f, \"states_gib\": %.3f, \"plan_states_gib\": %.3f, \"plan_peak_gib\": %.2f, \"zero_formula_gib\": %.3f, \"dp_wait_ms\": %.2f, \"dp_enqueue_ms\": %.2f, \"dp_host_ops_ms\": %.2f, \"dp_calls\": %.0f, \"gemm_tune\": %d, \"recompute_swiglu\": %d, "
         "\"last_stage_layers\": %d, \"stage_layers\": [%s], \"losses\": [",
         tessera::DTypeName(c.dtype), tp, dp, pp, l.vpp, l.schedule == parallel::Schedule::kGPipe ? "gpipe" : "1f1b", bubble,
         pp > 1 ? double(pp - 1) / (l.vpp * micro) : 0.0, stages.c_str(), zero, sp ? 1 : 0, static_cast<long long>(c.NumParams()),
         static_cast<long long>(seq), static_cast<long long>(mbs), static_cast<long long>(micro), static_cast<long long>(steps),
         1e3 * secs / steps,
         tokens / secs, flops / secs / 1e12, flops / secs / 1e12 / world, peak, states, plan_states, plan_total, formula,
         1e3 * dp_wait / steps, 1e3 * dp_host / steps,
         1e3 * dp_host_op / steps, dp_calls / steps,
         kernels::GemmTuning() ? 1 : 0, l.recompute_swiglu ? 1 : 0, l.last_stage_layers, absl::StrJoin(l.stage_layers, ", ").c_str());
  for (size_t i = 0; i < losses.size(); ++i) printf("%s%.4f", i ? ", " : "", losses[i]);
  printf("]}\n");
  return 0;
}
