#include "common/spec/job_paths.h"

#include <filesystem>

namespace tessera {

void ResolveRelativePaths(v1::JobSpec& spec, const std::string& base_dir) {
  auto absolute = [&](const std::string& p) {
    return p.empty() || p[0] == '/' ? p : (std::filesystem::path(base_dir) / p).lexically_normal().string();
  };
  auto* ck = spec.mutable_train()->mutable_checkpoint();
  ck->set_dir(absolute(ck->dir()));
  ck->set_load(absolute(ck->load()));
  if (ck->ByteSizeLong() == 0) spec.mutable_train()->clear_checkpoint();
  if (spec.has_train()) spec.mutable_train()->set_export_hf(absolute(spec.train().export_hf()));
  if (spec.has_model()) {
    spec.mutable_model()->set_hf_dir(absolute(spec.model().hf_dir()));
    if (spec.model().tokenizer() != "byte") spec.mutable_model()->set_tokenizer(absolute(spec.model().tokenizer()));
  }
  if (spec.has_train() && spec.train().has_data())
    spec.mutable_train()->mutable_data()->set_path(absolute(spec.train().data().path()));
  if (spec.has_rl()) {
    spec.mutable_rl()->set_reward_model(absolute(spec.rl().reward_model()));
    spec.mutable_rl()->set_eval_data(absolute(spec.rl().eval_data()));
  }
  if (spec.has_generate()) {
    auto* g = spec.mutable_generate();
    g->set_input(absolute(g->input()));
    g->set_output(absolute(g->output()));
    g->set_checkpoint(absolute(g->checkpoint()));
  }
}

}  // namespace tessera
