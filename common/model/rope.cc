#include "common/model/rope.h"

#include <algorithm>
#include <cmath>

namespace tessera::model {
namespace {
constexpr double kPi = 3.14159265358979323846;

// 1 / base^(2i / dim), i < dim / 2, in f32 as transformers forms it.
std::vector<float> PlainInvFreq(double base, int64_t dim) {
  std::vector<float> inv(dim / 2);
  const float b = static_cast<float>(base);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[i] = 1.f / std::pow(b, e);
  }
  return inv;
}

// YaRN's attention factor: 0.1 * mscale * ln(scale) + 1 above scale 1.
double YarnMscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }
}  // namespace

const char* RopeTypeName(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::kDefault: return "default";
    case RopeScaling::Type::kLinear: return "linear";
    case RopeScaling::Type::kDynamic: return "dynamic";
    case RopeScaling::Type::kYarn: return "yarn";
    case RopeScaling::Type::kLlama3: return "llama3";
  }
  return "?";
}

RopeFrequencies ComputeRopeFrequencies(const LlamaConfig& c, int64_t seq_len) {
  const RopeScaling& s = c.rope_scaling;
  const int64_t dim = c.HeadDim();
  RopeFrequencies f;
  switch (s.type) {
    case RopeScaling::Type::kDefault:
      f.inv_freq = PlainInvFreq(c.rope_base, dim);
      break;
    case RopeScaling::Type::kLinear:
      f.inv_freq = PlainInvFreq(c.rope_base, dim);
      for (float& v : f.inv_freq) v /= static_cast<float>(s.factor);
      break;
    case RopeScaling::Type::kDynamic: {
      // In f32, as transformers computes it from its batch's largest position (a tensor).
      const float len = static_cast<float>(std::max<int64_t>(seq_len, c.max_positions));
      const float grown = static_cast<float>(s.factor) * len / static_cast<float>(c.max_positions) -
                          static_cast<float>(s.factor - 1);
      const float base = static_cast<float>(c.rope_base) *
                         std::pow(grown, static_cast<float>(static_cast<double>(dim) / static_cast<double>(dim - 2)));
      f.inv_freq = PlainInvFreq(base, dim);
      break;
    }
    case RopeScaling::Type::kLlama3: {
      f.inv_freq = PlainInvFreq(c.rope_base, dim);
      const double old_len = static_cast<double>(s.original_max_positions > 0 ? s.original_max_positions : c.max_positions);
      const float factor = static_cast<float>(s.factor), low = static_cast<float>(s.low_freq_factor),
                  span = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
      const float low_wavelen = static_cast<float>(old_len / s.low_freq_factor),
                  high_wavelen = static_cast<float>(old_len / s.high_freq_factor);
      for (float& v : f.inv_freq) {
        const float wavelen = static_cast<float>(2 * kPi) / v;
        const float scaled = wavelen > low_wavelen ? v / factor : v;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
          const float smooth = (static_cast<float>(old_len) / wavelen - low) / span;
          v = (1 - smooth) * scaled / factor + smooth * scaled;
        } else {
          v = scaled;
        }
      }
      break;
    }
    case RopeScaling::Type::kYarn: {
      const double base = c.rope_base;
      const double original = static_cast<double>(s.original_max_positions > 0 ? s.original_max_positions : c.max_positions);
      // No factor: the ratio of the context lengths (DeepSeek-V3's configs).
      const double factor = s.factor > 0 ? s.factor : static_cast<double>(c.max_positions) / original;
      f.attention_scaling = static_cast<float>(
          s.attention_factor > 0 ? s.attention_factor
          : s.mscale > 0 && s.mscale_all_dim > 0 ? YarnMscale(factor, s.mscale) / YarnMscale(factor, s.mscale_all_dim)
                                                 : YarnMscale(factor, 1));
      auto correction_dim = [&](double rotations) {
        return static_cast<double>(dim) * std::log(original / (rotations * 2 * kPi)) / (2 * std::log(base));
      };
      double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
      if (s.truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0), high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;  // no zero-width ramp
      const int64_t half = dim / 2;
      f.inv_freq.resize(half);
      const float fb = static_cast<float>(base);
      for (int64_t i = 0; i < half; ++i) {
        const float pos_freq = std::pow(fb, static_cast<float>(2 * i) / static_cast<float>(dim));
        const float extrapolation = 1.f / pos_freq, interpolation = 1.f / (static_cast<float>(factor) * pos_freq);
        const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.f, 1.f);
        const float keep = 1 - ramp;  // the extrapolation's share
        f.inv_freq[i] = interpolation * (1 - keep) + extrapolation * keep;
      }
      break;
    }
  }
  return f;
}

}  // namespace tessera::model
