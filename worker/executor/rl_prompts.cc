#include "worker/executor/rl_prompts.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/rl.h"
#include "common/status.h"
#include "worker/executor/train.h"

namespace tessera::executor {

absl::Status RlPrompts::Load(const v1::JobSpec& spec, int64_t model_vocab) {
  const auto& t = spec.train();
  const v1::RlSpec& rl = spec.rl();
  data_ = {t.data().digits(), t.seed(), spec.model().seq_len(), /*answer_only=*/false};
  longest_ = 2 * t.data().digits() + 2;  // "a+b="
  text_.tokenizer = tokenizer::MakeByteTokenizer();
  if (t.data().kind() == "jsonl") {  // prompts through the model's tokenizer (bytes by default)
    TESSERA_ASSIGN_OR_RETURN(text_, ModelTextFromSpec(spec.model(), model_vocab));
    const std::string& path = t.data().path();
    TESSERA_ASSIGN_OR_RETURN(file_, engine::LoadPromptAnswers(path));
    longest_ = 0;
    for (const engine::PromptAnswer& p : file_) {
      std::string text;
      TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, engine::EncodePrompt(p, path, text_, &text));
      longest_ = std::max<int64_t>(longest_, static_cast<int64_t>(ids.size()));
      ids_.push_back(std::move(ids));
      texts_.push_back(std::move(text));
    }
    stops_ = text_.eos_ids;
  }
  for (int i = 0; i < rl.stop_size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(auto ids, text_.tokenizer->Encode(rl.stop(i)));
    if (ids.size() != 1)
      return absl::InvalidArgumentError(absl::StrCat("rl.stop[", i, "]: '", rl.stop(i), "' is ", ids.size(), " tokens of ",
                                                     text_.tokenizer->name(), "; a stop string must be one token"));
    stops_.push_back(ids[0]);
  }
  return absl::OkStatus();
}

RlPrompts::Prompt RlPrompts::At(int64_t index) const {
  Prompt p;
  if (!file_.empty()) {
    const size_t k = static_cast<size_t>(index % static_cast<int64_t>(file_.size()));
    p.ids = ids_[k], p.text = texts_[k], p.answer = file_[k].answer;
    return p;
  }
  const std::string problem = engine::ArithmeticProblem(data_, index);
  const size_t eq = problem.find('=') + 1;
  p.text = problem.substr(0, eq);
  p.answer = problem.substr(eq);
  for (unsigned char c : p.text) p.ids.push_back(c);  // bytes are tokens of the byte tokenizer
  return p;
}

std::string RlPrompts::CompletionText(const std::vector<int32_t>& tokens) const {
  std::vector<int32_t> known;
  for (int32_t t : tokens) if (t >= 0 && t < text_.tokenizer->vocab_size()) known.push_back(t);
  auto text = text_.tokenizer->Decode(known, /*skip_special=*/true);
  return text.ok() ? *text : std::string();
}

double RlPrompts::Reward(const std::string& completion_text, const std::string& answer) const {
  return !file_.empty() ? rl::ExactAnswerReward(completion_text, answer) : completion_text == answer ? 1.0 : 0.0;
}

absl::StatusOr<std::string> HeldOutEval(engine::RolloutEngine& rollout, const RlPrompts& prompts, int64_t max_new_tokens,
                                        int64_t problems, int dp_rank, int dps) {
  if (prompts.jsonl()) return absl::FailedPreconditionError("rl_eval: held-out problems are the built-in arithmetic ones");
  if (problems < 1 || problems > 1000000)
    return absl::InvalidArgumentError(absl::StrCat("rl_eval: problems ", problems, "; expected 1..1000000"));
  engine::ArithmeticData held = prompts.arithmetic();
  held.held_out = true;
  const int64_t begin = problems * dp_rank / dps, end = problems * (dp_rank + 1) / dps;
  std::vector<engine::GenerationRequest> requests;
  std::vector<std::string> answers;
  for (int64_t i = begin; i < end; ++i) {
    const std::string p = engine::ArithmeticProblem(held, i);
    const size_t eq = p.find('=') + 1;
    engine::GenerationRequest r;
    r.prompt.assign(p.begin(), p.begin() + eq);
    r.params.temperature = 0;  // greedy
    r.params.max_new_tokens = max_new_tokens;
    r.params.stop_tokens = {'\n'};
    requests.push_back(std::move(r));
    answers.push_back(p.substr(eq));
  }
  int64_t correct = 0;
  if (!requests.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<engine::Completion> out, rollout.Generate(requests));
    for (const engine::Completion& c : out) correct += std::string(c.tokens.begin(), c.tokens.end()) == answers[c.request];
  }
  return nlohmann::json{{"correct", correct}, {"problems", end - begin}}.dump();
}

}  // namespace tessera::executor
