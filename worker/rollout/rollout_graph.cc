// The rollout engine's decode step as a CUDA graph (see RolloutOptions::cuda_graphs).
// The running batch is padded to a power of two (the padded rows decode token 0 at
// position 0 into scratch slots past the cache's blocks, and are discarded), the block
// tables to a power-of-two width; each (batch, width) gets static device buffers and,
// from its second use on, a graph of the whole step — embedding, every layer with its
// cache write and paged attention, the LM head and the sampling kernel — captured from
// the same code the eager step runs (Generator::DecodeStep + Backend::Sample). A step
// is then: the host checks and packs its indices, three uploads, one graph launch, two
// downloads. The first use runs eagerly on the same buffers (it also warms cuBLASLt's
// plans, so that the capture records only kernels). A failed capture turns graphs off
// for the engine (logged once) and the step runs eagerly.
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/rollout/rollout.h"
#include "worker/rollout/rollout_seq.h"

namespace tessera::engine {
using runtime::Tensor;

namespace {
int64_t Pow2AtLeast(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}
}  // namespace

bool RolloutEngine::GraphsUsable() const {
  return options_.cuda_graphs && device_sampling_ && !graphs_failed_ && model::Generator::DecodeOnDeviceSupported(*model_);
}

uint64_t RolloutEngine::GraphFingerprint() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p) { h = (h ^ reinterpret_cast<uintptr_t>(p)) * 1099511628211ull; };
  for (auto& p : model_->params()) mix(p.weight().data());
  if (gen_ != nullptr)
    for (size_t l = 0; l < gen_->cache().k.size(); ++l) mix(gen_->cache().k[l].data()), mix(gen_->cache().v[l].data());
  return h;
}

absl::Status RolloutEngine::RunDecodeGraphOps(DecodeGraph& g) {
  runtime::Backend& be = model_->backend();
  const int64_t nb = g.batch;
  auto i32 = [&](int64_t at, int64_t len) { return g.i32.Slice(0, at * nb, len); };
  model::DeviceDecode d;
  TESSERA_ASSIGN_OR_RETURN(d.tokens, i32(0, nb));
  TESSERA_ASSIGN_OR_RETURN(d.positions, i32(1, nb));
  TESSERA_ASSIGN_OR_RETURN(d.slots, i32(2, nb));
  TESSERA_ASSIGN_OR_RETURN(d.lens, i32(3, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor top_k, i32(4, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor tables, i32(5, nb * g.max_blocks));
  TESSERA_ASSIGN_OR_RETURN(d.tables, tables.Reshape({nb, g.max_blocks}));
  TESSERA_ASSIGN_OR_RETURN(Tensor temperature, g.f32.Slice(0, 0, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor top_p, g.f32.Slice(0, nb, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor seed, g.i64.Slice(0, 0, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor offset, g.i64.Slice(0, nb, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor logits, gen_->DecodeStep(d));
  return be.Sample(logits, temperature, top_k, top_p, seed, offset, g.token, g.logprob);
}

absl::Status RolloutEngine::DecodeWithGraph(std::vector<Seq*>& running) {
  runtime::Backend& be = model_->backend();
  const int64_t bs = options_.block_size, n = static_cast<int64_t>(running.size());
  const int64_t nb = Pow2AtLeast(n);
  int64_t widest = 1;
  for (Seq* s : running) widest = std::max<int64_t>(widest, static_cast<int64_t>(s->blocks.size()));
  const int64_t maxb = Pow2AtLeast(widest);
  DecodeGraph& g = graphs_[{nb, maxb}];
  if (!g.i32.defined()) {
    g.batch = nb, g.max_blocks = maxb;
    TESSERA_ASSIGN_OR_RETURN(g.i32, be.Empty({5 * nb + nb * maxb}, DType::kI32));
    TESSERA_ASSIGN_OR_RETURN(g.f32, be.Empty({2 * nb}, DType::kF32));
    TESSERA_ASSIGN_OR_RETURN(g.i64, be.Empty({2 * nb}, DType::kI64));
    TESSERA_ASSIGN_OR_RETURN(g.token, be.Empty({nb}, DType::kI32));
    TESSERA_ASSIGN_OR_RETURN(g.logprob, be.Empty({nb}, DType::kF32));
  }
  // The step's inputs on the host: real rows, then padded rows (token 0 at position 0,
  // greedy, a scratch slot each, one scratch block in the table).
  std::vector<int32_t> i32(5 * nb + nb * maxb, -1);
  std::vector<float> f32(2 * nb);
  std::vector<int64_t> i64(2 * nb, 0);
  int32_t *tokens = i32.data(), *positions = tokens + nb, *slots = positions + nb, *lens = slots + nb, *top_k = lens + nb,
          *tables = top_k + nb;
  SamplingInputs(running, f32.data(), top_k, f32.data() + nb, i64.data(), i64.data() + nb);
  for (int64_t i = 0; i < nb; ++i) {
    if (i < n) {
      const Seq& s = *running[i];
      const int64_t pos = static_cast<int64_t>(s.tokens.size()) - 1;  // the newest token, not yet in the cache
      tokens[i] = s.tokens[pos], positions[i] = static_cast<int32_t>(pos), lens[i] = static_cast<int32_t>(pos + 1);
      slots[i] = s.Slot(pos, bs);
      std::copy(s.blocks.begin(), s.blocks.end(), tables + i * maxb);
    } else {
      tokens[i] = 0, positions[i] = 0, lens[i] = 1, top_k[i] = 0;
      slots[i] = static_cast<int32_t>(scratch_block_ * bs + i);
      tables[i * maxb] = static_cast<int32_t>(scratch_block_ + i / bs);
      f32[i] = 0.f, f32[nb + i] = 1.f;
    }
  }
  TESSERA_RETURN_IF_ERROR(runtime::Backend::CheckCacheSlots(gen_->cache().k[0], slots, nb));
  TESSERA_RETURN_IF_ERROR(runtime::Backend::CheckPagedIndices(gen_->cache().k[0], tables, nb, maxb, lens));
  TESSERA_RETURN_IF_ERROR(be.CopyFromHost(i32.data(), g.i32));
  TESSERA_RETURN_IF_ERROR(be.CopyFromHost(f32.data(), g.f32));
  TESSERA_RETURN_IF_ERROR(be.CopyFromHost(i64.data(), g.i64));
  ++decode_steps_;
  if (g.graph == nullptr && g.uses >= 1) {  // second use: capture (the ops are recorded, not run)
    TESSERA_RETURN_IF_ERROR(be.BeginCapture());
    const absl::Status ran = RunDecodeGraphOps(g);
    auto graph = be.EndCapture();
    if (ran.ok() && graph.ok()) {
      g.graph = std::move(*graph);
    } else {
      graphs_failed_ = true;
      spdlog::warn("rollout: decode runs without CUDA graphs: {}",
                   (!ran.ok() ? ran : graph.status()).ToString());
    }
  }
  ++g.uses;
  if (g.graph != nullptr) {
    TESSERA_RETURN_IF_ERROR(g.graph->Launch());
    ++graph_steps_;
  } else {
    TESSERA_RETURN_IF_ERROR(RunDecodeGraphOps(g));
  }
  std::vector<int32_t> token(nb);
  std::vector<float> logprob(nb);
  TESSERA_RETURN_IF_ERROR(be.CopyToHost(g.token, token.data()));
  TESSERA_RETURN_IF_ERROR(be.CopyToHost(g.logprob, logprob.data()));
  Append(running, token.data(), logprob.data());
  return absl::OkStatus();
}

}  // namespace tessera::engine
