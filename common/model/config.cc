#include "common/model/config.h"

#include "common/model/rope.h"
#include "common/parallel/layout.h"

#include "absl/strings/str_cat.h"

namespace tessera::model {
namespace {
absl::Status Bad(const std::string& what) { return absl::InvalidArgumentError(absl::StrCat("model config: ", what)); }
}  // namespace

absl::Status LlamaConfig::Validate() const {
  struct Field {
    const char* name;
    int64_t value;
  };
  for (Field f : {Field{"vocab", vocab}, Field{"hidden", hidden}, Field{"layers", layers}, Field{"heads", heads},
                  Field{"kv_heads", kv_heads}, Field{"ffn", ffn}})
    if (f.value <= 0) return Bad(absl::StrCat(f.name, " must be > 0, got ", f.value));
  if (heads % kv_heads != 0)
    return Bad(absl::StrCat("heads (", heads, ") must be a multiple of kv_heads (", kv_heads, ")"));
  if (head_dim < 0) return Bad(absl::StrCat("head_dim must be >= 0 (0: hidden / heads), got ", head_dim));
  if (dtype != tessera::DType::kF32 && dtype != tessera::DType::kBF16)
    return Bad(absl::StrCat("dtype must be f32 or bf16, got ", tessera::DTypeName(dtype)));
  if (head_dim == 0 && hidden % heads != 0)
    return Bad(absl::StrCat("hidden (", hidden, ") must be a multiple of heads (", heads, ") when head_dim is not set"));
  if (HeadDim() % 2 != 0) return Bad(absl::StrCat("head_dim must be even for RoPE, got ", HeadDim()));
  if (!(rope_base > 1.f)) return Bad(absl::StrCat("rope_base must be > 1, got ", rope_base));
  if (HeadDim() > 256) return Bad(absl::StrCat("head_dim must be at most 256, got ", HeadDim()));
  if (rope_scaling.type != RopeScaling::Type::kDefault && rope_scaling.type != RopeScaling::Type::kYarn &&
      !(rope_scaling.factor > 0))
    return Bad(absl::StrCat("rope_scaling: ", RopeTypeName(rope_scaling.type), " needs a factor > 0, got ", rope_scaling.factor));
  if (rope_scaling.type == RopeScaling::Type::kDynamic && max_positions <= 0)
    return Bad("rope_scaling: dynamic needs max_positions (max_position_embeddings) > 0");
  if (rope_scaling.type == RopeScaling::Type::kLlama3 &&
      ((rope_scaling.original_max_positions <= 0 && max_positions <= 0) || !(rope_scaling.low_freq_factor > 0) ||
       !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)))
    return Bad("rope_scaling: llama3 needs original_max_positions (or max_positions) > 0 and 0 < low_freq_factor < "
               "high_freq_factor");
  if (rope_scaling.type == RopeScaling::Type::kYarn &&
      (rope_scaling.factor < 0 || (rope_scaling.original_max_positions <= 0 && max_positions <= 0) ||
       (rope_scaling.factor == 0 && (rope_scaling.original_max_positions <= 0 || max_positions <= 0))))
    return Bad("rope_scaling: yarn needs original_max_positions or max_positions > 0, and a factor or both");
  if (!(norm_eps > 0.f)) return Bad(absl::StrCat("norm_eps must be > 0, got ", norm_eps));
  if (value_head && tie_embeddings) return Bad("value_head: a critic's value head is not tied to the embedding");
  return absl::OkStatus();
}

absl::Status LlamaConfig::ValidateTensorParallel(int tp) const {
  if (tp < 1) return Bad(absl::StrCat("tensor parallel degree must be >= 1, got ", tp));
  struct Field {
    const char* name;
    int64_t value;
  };
  if (kv_heads % tp != 0 && tp % kv_heads != 0)
    return Bad(absl::StrCat("kv_heads (", kv_heads, ") must be a multiple of the tensor parallel degree (", tp,
                            ") or divide it (each KV head then replicated on tp / kv_heads ranks)"));
  for (Field f : {Field{"heads", heads}, Field{"ffn", ffn}, Field{"vocab", vocab}})
    if (f.value % tp != 0)
      return Bad(absl::StrCat(f.name, " (", f.value, ") must be a multiple of the tensor parallel degree (", tp,
                              ")", std::string(f.name) == "vocab" ? "; pad the vocabulary" : ""));
  return absl::OkStatus();
}

std::vector<ParamSpec> LlamaParamSpecs(const LlamaConfig& c) {
  const int64_t d = c.HeadDim(), q = c.heads * d, kv = c.kv_heads * d;
  std::vector<ParamSpec> p;
  p.push_back({"model.embed_tokens.weight", {c.vocab, c.hidden}, 0});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string l = absl::StrCat("model.layers.", i, ".");
    p.push_back({l + "input_layernorm.weight", {c.hidden}});
    p.push_back({l + "self_attn.q_proj.weight", {q, c.hidden}, 0});
    p.push_back({l + "self_attn.k_proj.weight", {kv, c.hidden}, 0, c.kv_heads});
    p.push_back({l + "self_attn.v_proj.weight", {kv, c.hidden}, 0, c.kv_heads});
    if (c.qkv_bias) {
      p.push_back({l + "self_attn.q_proj.bias", {q}, 0});
      p.push_back({l + "self_attn.k_proj.bias", {kv}, 0, c.kv_heads});
      p.push_back({l + "self_attn.v_proj.bias", {kv}, 0, c.kv_heads});
    }
    if (c.qk_norm) {  // shared by every head: replicated over TP
      p.push_back({l + "self_attn.q_norm.weight", {d}});
      p.push_back({l + "self_attn.k_norm.weight", {d}});
    }
    p.push_back({l + "self_attn.o_proj.weight", {c.hidden, q}, 1});
    p.push_back({l + "post_attention_layernorm.weight", {c.hidden}});
    p.push_back({l + "mlp.gate_proj.weight", {c.ffn, c.hidden}, 0});
    p.push_back({l + "mlp.up_proj.weight", {c.ffn, c.hidden}, 0});
    p.push_back({l + "mlp.down_proj.weight", {c.hidden, c.ffn}, 1});
  }
  p.push_back({"model.norm.weight", {c.hidden}});
  if (c.value_head) p.push_back({"score.weight", {1, c.hidden}});
  else if (!c.tie_embeddings) p.push_back({"lm_head.weight", {c.vocab, c.hidden}, 0});
  return p;
}

int64_t LlamaConfig::NumParams() const {
  int64_t n = 0;
  for (const auto& s : LlamaParamSpecs(*this)) {
    int64_t e = 1;
    for (int64_t d : s.shape) e *= d;
    n += e;
  }
  return n;
}

int StageOf(const std::string& param, const LlamaConfig& c, const StageSpec& s) {
  if (param == "model.embed_tokens.weight") return 0;
  if (param == "model.norm.weight" || param == "lm_head.weight" || param == "score.weight") return s.pp - 1;
  const int64_t layer = std::stoll(param.substr(13, param.find('.', 13) - 13));  // model.layers.N.
  const int stages = s.pp * s.vpp;
  for (int v = 0; v < stages; ++v) {
    const auto [b, e] = parallel::VirtualStageLayers(c.layers, stages, s.last_layers, s.stage_layers, v);
    if (layer >= b && layer < e) return v % s.pp;
  }
  return s.pp - 1;
}

std::pair<int64_t, int64_t> ChunkLayers(const LlamaConfig& c, const StageSpec& s, int chunk) {
  return parallel::VirtualStageLayers(c.layers, s.pp * s.vpp, s.last_layers, s.stage_layers, chunk * s.pp + s.rank);
}

bool StageHolds(const std::string& param, const LlamaConfig& c, const StageSpec& s) {
  if (param == "model.embed_tokens.weight" && c.tie_embeddings && s.rank == s.pp - 1) return true;
  return StageOf(param, c, s) == s.rank;
}

TpSplit TpSplitOf(const ParamSpec& s, int tp, int rank) {
  TpSplit t;
  if (tp <= 1) return t;
  if (s.shard_dim < 0) {  // whole on every rank
    t.replicas = tp, t.replica = rank;
    return t;
  }
  t.dim = s.shard_dim;
  t.parts = s.max_parts > 0 && s.max_parts < tp ? static_cast<int>(s.max_parts) : tp;
  t.replicas = tp / t.parts;
  t.index = rank / t.replicas, t.replica = rank % t.replicas;
  return t;
}

std::vector<float> TpShardOf(const std::vector<float>& g, const std::vector<int64_t>& shape, int dim, int parts,
                             int index) {
  if (dim < 0 || parts == 1) return g;
  const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
  if (dim == 0) {
    const int64_t n = rows / parts * cols;
    return std::vector<float>(g.begin() + index * n, g.begin() + (index + 1) * n);
  }
  const int64_t c = cols / parts;
  std::vector<float> out;
  out.reserve(rows * c);
  for (int64_t r = 0; r < rows; ++r) out.insert(out.end(), g.begin() + r * cols + index * c, g.begin() + r * cols + (index + 1) * c);
  return out;
}

}  // namespace tessera::model
