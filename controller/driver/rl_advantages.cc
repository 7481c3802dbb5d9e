#include "controller/driver/rl_advantages.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rl.h"
#include "common/rpc/tensor_stream.h"
#include "common/spec/rl_options.h"
#include "common/status.h"

namespace tessera::controller {
namespace {

const v1::NamedTensor* Find(const v1::TensorBatch& b, const std::string& name) {
  for (const auto& t : b.tensors())
    if (t.name() == name) return &t;
  return nullptr;
}

// Tensor `name`'s values, checked: dtype, [n] or [n, width] (width 0: any), its bytes.
template <typename T>
absl::StatusOr<std::vector<T>> Values(const v1::TensorBatch& b, const std::string& name, v1::DType dtype, int64_t n,
                                      int dims, int64_t* width) {
  const v1::NamedTensor* t = Find(b, name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("samples: no tensor '", name, "'"));
  const bool shaped = t->dtype() == dtype && t->shape_size() == dims && t->shape(0) == n;
  const int64_t elems = shaped && dims == 2 ? n * t->shape(1) : n;
  if (!shaped || t->data().size() != static_cast<size_t>(elems) * sizeof(T))
    return absl::InvalidArgumentError(absl::StrCat("samples: tensor '", name, "' is not [", n, dims == 2 ? ", W" : "", "] ",
                                                   v1::DType_Name(dtype)));
  if (dims == 2) *width = t->shape(1);
  std::vector<T> v(static_cast<size_t>(elems));
  if (!v.empty()) std::memcpy(v.data(), t->data().data(), v.size() * sizeof(T));
  return v;
}

v1::NamedTensor TokenTensor(const std::string& name, const std::vector<std::vector<double>>& rows, int64_t width) {
  std::vector<float> flat(rows.size() * static_cast<size_t>(width), 0.0f);
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t k = 0; k < rows[i].size(); ++k) flat[i * width + k] = static_cast<float>(rows[i][k]);
  return F32Tensor(name, {static_cast<int64_t>(rows.size()), width}, flat);
}

}  // namespace

absl::Status AddPpoAdvantages(const v1::RlSpec& rl, int actor_dp, v1::TensorBatch* batch, double* reward_kl) {
  const v1::NamedTensor* rw = Find(*batch, "reward");
  if (rw == nullptr || rw->shape_size() != 1) return absl::InvalidArgumentError("samples: no tensor 'reward' [N]");
  const int64_t n = rw->shape(0);
  if (actor_dp < 1 || n % actor_dp != 0)
    return absl::InvalidArgumentError(absl::StrCat("samples: ", n, " rows do not split over dp=", actor_dp));
  int64_t width = 0, w = 0;
  TESSERA_ASSIGN_OR_RETURN(std::vector<float> reward, Values<float>(*batch, "reward", v1::DTYPE_F32, n, 1, &w));
  TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> len, Values<int32_t>(*batch, "completion_len", v1::DTYPE_I32, n, 1, &w));
  TESSERA_ASSIGN_OR_RETURN(std::vector<float> value, Values<float>(*batch, "old_value", v1::DTYPE_F32, n, 2, &width));
  // Each row's response tokens: its completion's, or of a multi-turn sample only those the
  // model sampled (completion_mask 1) — the token tensors hold those, in order.
  std::vector<int32_t> tokens = len;
  if (Find(*batch, "completion_mask") != nullptr) {
    int64_t mw = 0;
    TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> mask, Values<int32_t>(*batch, "completion_mask", v1::DTYPE_I32, n, 2, &mw));
    for (int64_t i = 0; i < n; ++i) {
      tokens[i] = 0;
      for (int64_t k = 0; k < std::min<int64_t>(len[i], mw); ++k) tokens[i] += mask[i * mw + k] != 0;
    }
  }
  const bool penalty = rl.kl_reward_coef() > 0;
  std::vector<float> old_logp, ref_logp;
  if (penalty) {
    for (const char* name : {"old_logp", "ref_logp"}) {
      TESSERA_ASSIGN_OR_RETURN(std::vector<float> v, Values<float>(*batch, name, v1::DTYPE_F32, n, 2, &w));
      if (w != width) return absl::InvalidArgumentError(absl::StrCat("samples: tensor '", name, "' is ", w, " wide, old_value ", width));
      (std::string(name) == "old_logp" ? old_logp : ref_logp) = std::move(v);
    }
  }
  rl::PpoAdvantageOptions o;
  o.gamma = rl.gamma(), o.lambda = rl.gae_lambda(), o.kl_reward_coef = rl.kl_reward_coef(), o.whiten = true;
  TESSERA_ASSIGN_OR_RETURN(o.kl_reward, KlRewardEstimatorOf(rl));
  const rl::OverlongOptions overlong = OverlongOf(rl);
  std::vector<std::vector<double>> advantages, returns;
  double kl = 0;
  const int64_t per = n / actor_dp;
  for (int d = 0; d < actor_dp; ++d) {
    std::vector<rl::PpoResponse> in(per);
    for (int64_t j = 0; j < per; ++j) {
      const int64_t i = d * per + j;
      if (len[i] < 0 || len[i] > width)
        return absl::InvalidArgumentError(absl::StrCat("samples: completion_len[", i, "] = ", len[i], " outside [0, ", width, "]"));
      rl::PpoResponse& r = in[j];
      r.reward = reward[i] + rl::OverlongPenalty(len[i], overlong);
      for (int64_t k = 0; k < tokens[i]; ++k) {
        r.values.push_back(value[i * width + k]);
        if (penalty) r.old_logp.push_back(old_logp[i * width + k]), r.ref_logp.push_back(ref_logp[i * width + k]);
      }
    }
    TESSERA_ASSIGN_OR_RETURN(rl::PpoAdvantages got, rl::ComputePpoAdvantages(in, o));
    kl += got.reward_kl / actor_dp;
    for (auto& a : got.advantages) advantages.push_back(std::move(a));
    for (auto& r : got.returns) returns.push_back(std::move(r));
  }
  *batch->add_tensors() = TokenTensor("advantage", advantages, width);
  *batch->add_tensors() = TokenTensor("returns", returns, width);
  *reward_kl = kl;
  return absl::OkStatus();
}

absl::StatusOr<double> TakeScores(const v1::TensorBatch& scored, v1::TensorBatch* batch) {
  const v1::NamedTensor* rw = Find(*batch, "reward");
  if (rw == nullptr || rw->shape_size() != 1) return absl::InvalidArgumentError("samples: no tensor 'reward' [N]");
  int64_t w = 0;
  TESSERA_ASSIGN_OR_RETURN(std::vector<float> score, Values<float>(scored, "score", v1::DTYPE_F32, rw->shape(0), 1, &w));
  double mean = 0;
  for (float x : score) mean += x / static_cast<double>(score.size());
  for (v1::NamedTensor& t : *batch->mutable_tensors())
    if (t.name() == "reward") t = F32Tensor("reward", {static_cast<int64_t>(score.size())}, score);
  return mean;
}

absl::StatusOr<double> BatchTokens(const v1::TensorBatch& batch) {
  const v1::NamedTensor* len = Find(batch, "prompt_len");
  if (len == nullptr || len->shape_size() != 1) return absl::InvalidArgumentError("samples: no tensor 'prompt_len' [N]");
  double tokens = 0;
  int64_t w = 0;
  for (const char* name : {"prompt_len", "completion_len"}) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> v, Values<int32_t>(batch, name, v1::DTYPE_I32, len->shape(0), 1, &w));
    for (int32_t x : v) tokens += x;
  }
  return tokens;
}

absl::Status GroupFilter::Add(v1::TensorBatch generated) {
  const v1::NamedTensor* rw = Find(generated, "reward");
  if (rw == nullptr || rw->shape_size() != 1) return absl::InvalidArgumentError("samples: no tensor 'reward' [N]");
  const int64_t n = rw->shape(0);
  if (group_size_ < 1 || n % group_size_ != 0)
    return absl::InvalidArgumentError(absl::StrCat("samples: ", n, " rows are not whole groups of ", group_size_));
  for (const v1::NamedTensor& t : generated.tensors())
    if (t.shape_size() == 0 || t.shape(0) != n)
      return absl::InvalidArgumentError(absl::StrCat("samples: tensor '", t.name(), "' does not have the batch's ", n, " rows"));
  int64_t w = 0;
  TESSERA_ASSIGN_OR_RETURN(std::vector<float> reward, Values<float>(generated, "reward", v1::DTYPE_F32, n, 1, &w));
  const size_t b = batches_.size();
  for (int64_t g = 0; g < n / group_size_; ++g) {
    bool equal = true;
    for (int64_t i = 1; i < group_size_; ++i) equal = equal && reward[g * group_size_ + i] == reward[g * group_size_];
    (equal ? dropped_ : kept_).push_back({b, g});
  }
  batches_.push_back(std::move(generated));
  return absl::OkStatus();
}

absl::StatusOr<v1::TensorBatch> GroupFilter::Take() {
  if (batches_.empty()) return absl::FailedPreconditionError("dynamic sampling: nothing generated");
  std::vector<std::pair<size_t, int64_t>> take(kept_.begin(), kept_.begin() + std::min<size_t>(kept_.size(), groups_));
  filled_ = 0;
  for (size_t i = 0; static_cast<int>(take.size()) < groups_ && i < dropped_.size(); ++i) take.push_back(dropped_[i]), ++filled_;
  if (static_cast<int>(take.size()) < groups_)
    return absl::FailedPreconditionError(absl::StrCat("dynamic sampling: ", take.size(), " groups generated, ", groups_, " needed"));
  v1::TensorBatch out;
  for (const v1::NamedTensor& first : batches_[0].tensors()) {
    v1::NamedTensor* t = out.add_tensors();
    t->set_name(first.name()), t->set_dtype(first.dtype());
    t->add_shape(int64_t{groups_} * group_size_);
    for (int i = 1; i < first.shape_size(); ++i) t->add_shape(first.shape(i));
    std::string data;
    for (auto [b, g] : take) {
      const v1::NamedTensor* src = Find(batches_[b], first.name());
      if (src == nullptr || src->dtype() != first.dtype() || src->shape_size() != first.shape_size() ||
          !std::equal(src->shape().begin() + 1, src->shape().end(), first.shape().begin() + 1))
        return absl::InvalidArgumentError(absl::StrCat("samples: tensor '", first.name(), "' differs between generations"));
      const size_t row = src->data().size() / static_cast<size_t>(src->shape(0));
      data.append(src->data(), static_cast<size_t>(g * group_size_) * row, static_cast<size_t>(group_size_) * row);
    }
    t->set_data(std::move(data));
  }
  return out;
}

}  // namespace tessera::controller
