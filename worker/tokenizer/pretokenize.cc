#include "worker/tokenizer/pretokenize.h"

#include "absl/strings/str_cat.h"
#include "worker/tokenizer/unicode.h"

namespace tessera::tokenizer {
namespace {

constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The text as code points with their byte offsets, and the pattern's classes.
class Scanner {
 public:
  explicit Scanner(std::string_view text) {
    for (size_t i = 0; i < text.size();) {
      const CodePoint c = DecodeOne(text.substr(i));
      cps_.push_back(c.cp);
      offsets_.push_back(i);
      i += c.bytes;
    }
    offsets_.push_back(text.size());
  }
  size_t size() const { return cps_.size(); }
  size_t offset(size_t i) const { return offsets_[i]; }
  char32_t at(size_t i) const { return i < cps_.size() ? cps_[i] : 0; }
  bool L(size_t i) const { return i < cps_.size() && IsLetter(cps_[i]); }
  bool N(size_t i) const { return i < cps_.size() && IsNumber(cps_[i]); }
  bool W(size_t i) const { return i < cps_.size() && IsWhitespace(cps_[i]); }
  bool O(size_t i) const { return i < cps_.size() && !W(i) && !L(i) && !N(i); }
  bool NewLine(size_t i) const { return at(i) == '\r' || at(i) == '\n'; }
  template <class F>
  size_t RunOf(size_t j, F in) const {
    while (j < cps_.size() && in(j)) ++j;
    return j;
  }

  // 's 't 're 've 'm 'll 'd at i: the end, or 0. `fold`: ASCII case-insensitive, and ſ
  // (U+017F) for s, as (?i:) matches it.
  size_t Contraction(size_t i, bool fold) const {
    if (at(i) != '\'') return 0;
    auto is = [&](size_t k, char c) {
      char32_t x = at(k);
      if (!fold) return x == static_cast<char32_t>(c);
      if (c == 's' && x == 0x17F) return true;
      return x == static_cast<char32_t>(c) || x == static_cast<char32_t>(c - 'a' + 'A');
    };
    for (char c : {'s', 't'}) if (is(i + 1, c)) return i + 2;
    if (is(i + 1, 'r') && is(i + 2, 'e')) return i + 3;
    if (is(i + 1, 'v') && is(i + 2, 'e')) return i + 3;
    if (is(i + 1, 'm')) return i + 2;
    if (is(i + 1, 'l') && is(i + 2, 'l')) return i + 3;
    if (is(i + 1, 'd')) return i + 2;
    return 0;
  }

  // \s+(?!\S)|\s+ at a whitespace i: the whole run at the end of the text or before
  // more whitespace; before a non-space, the run but its last character (which then
  // starts the next piece), or the one character when the run has only it.
  size_t Spaces(size_t i) const {
    const size_t j = RunOf(i, [&](size_t k) { return W(k); });
    if (j == size()) return j;
    return j - i >= 2 ? j - 1 : i + 1;
  }

 private:
  std::vector<char32_t> cps_;
  std::vector<size_t> offsets_;
};

size_t NextGpt2(const Scanner& s, size_t i) {
  if (size_t e = s.Contraction(i, false)) return e;
  const size_t k = s.at(i) == ' ' ? i + 1 : i;  // the optional leading space
  if (s.L(k)) return s.RunOf(k, [&](size_t j) { return s.L(j); });
  if (s.N(k)) return s.RunOf(k, [&](size_t j) { return s.N(j); });
  if (s.O(k)) return s.RunOf(k, [&](size_t j) { return s.O(j); });
  return s.Spaces(i);
}

size_t NextLlama3(const Scanner& s, size_t i, size_t max_digits) {
  if (size_t e = s.Contraction(i, true)) return e;
  auto letters = [&](size_t k) { return s.RunOf(k, [&](size_t j) { return s.L(j); }); };
  if (s.L(i)) return letters(i);
  if (!s.NewLine(i) && !s.N(i) && s.L(i + 1)) return letters(i + 1);
  if (s.N(i)) {
    size_t j = i;
    while (j - i < max_digits && s.N(j)) ++j;
    return j;
  }
  const size_t k = s.at(i) == ' ' && s.O(i + 1) ? i + 1 : i;
  if (s.O(k)) {
    const size_t j = s.RunOf(k, [&](size_t x) { return s.O(x); });
    return s.RunOf(j, [&](size_t x) { return s.NewLine(x); });
  }
  // \s*[\r\n]+: through the last line break of this whitespace run.
  const size_t j = s.RunOf(i, [&](size_t x) { return s.W(x); });
  for (size_t x = j; x > i; --x)
    if (s.NewLine(x - 1)) return x;
  return s.Spaces(i);
}

}  // namespace

absl::StatusOr<SplitPattern> PatternFromRegex(std::string_view regex) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2})
    if (regex == PatternRegex(p)) return p;
  return absl::UnimplementedError(absl::StrCat("pre-tokenizer regex ", std::string(regex),
                                               " is not one this tokenizer knows (GPT-2, Llama-3 or Qwen2's)"));
}

const char* PatternRegex(SplitPattern p) {
  switch (p) {
    case SplitPattern::kGpt2: return kGpt2Regex;
    case SplitPattern::kLlama3: return kLlama3Regex;
    case SplitPattern::kQwen2: return kQwen2Regex;
  }
  return "";
}

std::vector<std::string_view> PreTokenize(SplitPattern p, std::string_view text) {
  const Scanner s(text);
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t e = 0;
    switch (p) {
      case SplitPattern::kGpt2: e = NextGpt2(s, i); break;
      case SplitPattern::kLlama3: e = NextLlama3(s, i, 3); break;
      case SplitPattern::kQwen2: e = NextLlama3(s, i, 1); break;
    }
    out.push_back(text.substr(s.offset(i), s.offset(e) - s.offset(i)));
    i = e;
  }
  return out;
}

}  // namespace tessera::tokenizer
