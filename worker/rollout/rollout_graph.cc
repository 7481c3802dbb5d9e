// The rollout engine's decode-only step as a CUDA graph (see RolloutOptions::cuda_graphs).
// The running batch is padded to a power of two (the padded rows decode token 0 at
// position 0 into scratch slots past the cache's blocks, and are discarded), the block
// tables to a power-of-two width; each (batch, width) gets static device buffers and,
// from its second use on, a graph of the whole step — the tokens' select (sampled by the
// step before, or from the host), embedding, every layer with its cache write and paged
// attention, the LM head and the sampling kernel — captured from the same code the eager
// step runs (Backend::Select, Generator::DecodeStep, Backend::Sample). A step is then: the
// host packs its inputs into page-locked memory, one upload, one graph launch, and the
// tokens' and log-probs' one download (rollout_step.cc). The first use runs eagerly on the same buffers (it
// also warms cuBLASLt's plans, so that the capture records only kernels). A failed capture
// turns graphs off for the engine (logged once) and the step runs eagerly.
#include <spdlog/spdlog.h>

#include <cstring>

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
  return options_.cuda_graphs && !options_.sample_on_host && model_->backend().device().kind != runtime::DeviceKind::kCpu &&
         !graphs_failed_ && model::Generator::DecodeOnDeviceSupported(*model_);
}

uint64_t RolloutEngine::GraphFingerprint() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p) { h = (h ^ reinterpret_cast<uintptr_t>(p)) * 1099511628211ull; };
  for (auto& p : model_->params()) mix(p.weight().data());
  if (gen_ != nullptr)
    for (size_t l = 0; l < gen_->cache().k.size(); ++l) mix(gen_->cache().k[l].data()), mix(gen_->cache().v[l].data());
  mix(step_tokens_.defined() ? step_tokens_.data() : nullptr);
  return h;
}

absl::Status RolloutEngine::RunDecodeGraphOps(DecodeGraph& g) {
  runtime::Backend& be = model_->backend();
  const int64_t nb = g.batch;
  auto i32 = [&](int64_t at, int64_t len) { return g.i32.Slice(0, at * nb, len); };
  TESSERA_ASSIGN_OR_RETURN(Tensor values, i32(0, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor src, i32(1, nb));
  model::DeviceDecode d;
  d.tokens = g.tokens;
  TESSERA_ASSIGN_OR_RETURN(d.positions, i32(2, nb));
  TESSERA_ASSIGN_OR_RETURN(d.slots, i32(3, nb));
  TESSERA_ASSIGN_OR_RETURN(d.lens, i32(4, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor top_k, i32(5, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor tables, i32(6, nb * g.max_blocks));
  TESSERA_ASSIGN_OR_RETURN(d.tables, tables.Reshape({nb, g.max_blocks}));
  TESSERA_ASSIGN_OR_RETURN(Tensor temperature, g.f32.Slice(0, 0, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor top_p, g.f32.Slice(0, nb, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor seed, g.i64.Slice(0, 0, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor offset, g.i64.Slice(0, nb, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor tok, step_tokens_.Slice(0, 0, nb));
  TESSERA_ASSIGN_OR_RETURN(Tensor lp, step_logprobs_.Slice(0, 0, nb));
  be.set_trust_device_indices(true);  // src was checked on the host (LaunchGraph)
  const absl::Status selected = be.Select(src, step_tokens_, values, g.tokens);
  be.set_trust_device_indices(false);
  TESSERA_RETURN_IF_ERROR(selected);
  TESSERA_ASSIGN_OR_RETURN(Tensor logits, gen_->DecodeStep(d));
  return be.Sample(logits, temperature, top_k, top_p, seed, offset, tok, lp);
}

absl::Status RolloutEngine::LaunchGraph(const Plan& plan, Launched& out) {
  runtime::Backend& be = model_->backend();
  const int64_t bs = options_.block_size, n = static_cast<int64_t>(plan.paged.size());
  const int64_t nb = Pow2AtLeast(n), rows_cap = step_tokens_.numel();
  if (nb > rows_cap) return absl::InternalError(absl::StrCat("rollout: ", n, " decode rows past the graphs' ", rows_cap));
  int64_t widest = 1;
  for (const Plan::Rows& r : plan.paged) widest = std::max<int64_t>(widest, static_cast<int64_t>(r.seq->blocks.size()));
  const int64_t maxb = Pow2AtLeast(widest);
  DecodeGraph& g = graphs_[{nb, maxb}];
  if (!g.i32.defined()) {
    g.batch = nb, g.max_blocks = maxb;
    const int64_t n32 = 6 * nb + nb * maxb;
    TESSERA_ASSIGN_OR_RETURN(g.inputs, be.Empty({2 * nb * 8 + 2 * nb * 4 + n32 * 4}, DType::kU8));
    TESSERA_ASSIGN_OR_RETURN(g.i64, g.inputs.View(DType::kI64, {2 * nb}, 0));
    TESSERA_ASSIGN_OR_RETURN(g.f32, g.inputs.View(DType::kF32, {2 * nb}, static_cast<size_t>(nb) * 16));
    TESSERA_ASSIGN_OR_RETURN(g.i32, g.inputs.View(DType::kI32, {n32}, static_cast<size_t>(nb) * 24));
    TESSERA_ASSIGN_OR_RETURN(g.tokens, be.Empty({nb}, DType::kI32));
  }
  // The step's inputs, packed into this step's page-locked staging buffer: real rows, then
  // padded rows (token 0 at position 0, greedy, a scratch slot each, one scratch block in
  // the table).
  const size_t i64_bytes = g.i64.nbytes(), f32_bytes = g.f32.nbytes(), bytes = g.inputs.nbytes();
  const int slot = next_slot_;
  if (stage_[slot] == nullptr || stage_bytes_ < bytes) {  // larger: nothing may still read the old ones
    TESSERA_RETURN_IF_ERROR(be.Synchronize());
    for (auto& b : stage_) {
      TESSERA_ASSIGN_OR_RETURN(b, be.AllocHostStaging(2 * bytes));
    }
    stage_bytes_ = 2 * bytes;
  }
  char* stage = stage_[slot].get();
  int64_t* i64 = reinterpret_cast<int64_t*>(stage);  // the layout of g.inputs
  float* f32 = reinterpret_cast<float*>(stage + i64_bytes);
  int32_t* i32 = reinterpret_cast<int32_t*>(stage + i64_bytes + f32_bytes);
  std::fill(i32, i32 + 6 * nb + nb * maxb, -1);
  int32_t *values = i32, *src = values + nb, *positions = src + nb, *slots = positions + nb, *lens = slots + nb,
          *top_k = lens + nb, *tables = top_k + nb;
  std::vector<Seq*> seqs;
  for (const Plan::Rows& r : plan.paged) seqs.push_back(r.seq);
  SamplingInputs(seqs, f32, top_k, f32 + nb, i64, i64 + nb);
  for (int64_t i = 0; i < nb; ++i) {
    if (i < n) {
      const Seq& s = *seqs[i];
      const int64_t pos = plan.paged[i].first;  // the newest token, not yet in the cache
      s.TokenAt(pos, &values[i], &src[i]);
      positions[i] = static_cast<int32_t>(pos), lens[i] = static_cast<int32_t>(pos + 1);
      slots[i] = s.Slot(pos, bs);
      std::copy(s.blocks.begin(), s.blocks.end(), tables + i * maxb);
    } else {
      values[i] = 0, src[i] = -1, positions[i] = 0, lens[i] = 1, top_k[i] = 0;
      slots[i] = static_cast<int32_t>(scratch_block_ * bs + i);
      tables[i * maxb] = static_cast<int32_t>(scratch_block_ + i / bs);
      f32[i] = 0.f, f32[nb + i] = 1.f, i64[i] = i64[nb + i] = 0;
    }
    if (src[i] >= rows_cap) return absl::InternalError(absl::StrCat("rollout: a token source row ", src[i]));
  }
  TESSERA_RETURN_IF_ERROR(runtime::Backend::CheckCacheSlots(gen_->cache().k[0], slots, nb));
  TESSERA_RETURN_IF_ERROR(runtime::Backend::CheckPagedIndices(gen_->cache().k[0], tables, nb, maxb, lens));
  TESSERA_RETURN_IF_ERROR(be.CopyFromHost(stage, g.inputs));
  if (g.graph == nullptr && g.uses >= 1) {  // second use: capture (the ops are recorded, not run)
    TESSERA_RETURN_IF_ERROR(be.BeginCapture());
    const absl::Status ran = RunDecodeGraphOps(g);
    auto graph = be.EndCapture();
    if (ran.ok() && graph.ok()) {
      g.graph = std::move(*graph);
      last_graph_shape_ = g.graph->shape();
    } else {
      graphs_failed_ = true;
      spdlog::warn("rollout: decode runs without CUDA graphs: {}", (!ran.ok() ? ran : graph.status()).ToString());
    }
  }
  ++g.uses;
  if (g.graph != nullptr) {
    TESSERA_RETURN_IF_ERROR(g.graph->Launch());
    ++graph_steps_;
  } else {
    TESSERA_RETURN_IF_ERROR(RunDecodeGraphOps(g));
  }
  out.sampled = seqs;
  return FinishLaunch(out);
}

}  // namespace tessera::engine
