#include "common/plan/plan_spec.h"

#include "common/spec/job_spec.h"

namespace tessera::plan {

PlanInput PlanInputOf(const v1::JobSpec& spec, const model::LlamaConfig* hf_config) {
  return PlanInputOf(spec, spec.groups(0), hf_config);
}

PlanInput PlanInputOf(const v1::JobSpec& spec, const v1::GroupSpec& g, const model::LlamaConfig* hf_config) {
  const auto& m = spec.model();
  PlanInput in;
  if (hf_config != nullptr) {
    in.config = *hf_config;
  } else {
    auto& c = in.config;
    c.vocab = m.vocab_size(), c.hidden = m.hidden(), c.layers = m.num_layers(), c.heads = m.num_heads();
    c.kv_heads = m.num_kv_heads(), c.head_dim = m.head_dim(), c.ffn = m.ffn();
    c.tie_embeddings = m.tie_embeddings(), c.qkv_bias = m.qkv_bias();
  }
  in.layout = LayoutOf(g.layout());
  in.seq_len = m.seq_len(), in.micro_batch = m.micro_batch(), in.global_batch = m.global_batch();
  in.recompute = spec.train().recompute();
  in.recompute_swiglu = spec.train().recompute_swiglu();
  const std::string& prec = spec.train().precision();
  in.config.dtype = prec == "bf16" || ((prec.empty() || prec == "auto") && g.device_type() == v1::DEVICE_TYPE_GPU)
                        ? tessera::DType::kBF16
                        : tessera::DType::kF32;
  if (spec.train().schedule() == "gpipe") in.schedule = parallel::Schedule::kGPipe;
  return in;
}

}  // namespace tessera::plan
