#include "worker/tokenizer/unicode.h"

#include <algorithm>

namespace tessera::tokenizer {
namespace {

struct CodeRange {
  char32_t lo, hi;
};
struct CombiningRange {
  char32_t lo, hi;
  int ccc;
};
struct Decomposition {
  char32_t cp;
  uint32_t offset, length;
};
struct Composition {
  char32_t first, second, composite;
};
#include "worker/tokenizer/unicode_data.inc"

template <size_t N>
bool InRanges(const CodeRange (&r)[N], char32_t cp) {
  auto it = std::upper_bound(std::begin(r), std::end(r), cp, [](char32_t c, const CodeRange& x) { return c < x.lo; });
  return it != std::begin(r) && cp <= std::prev(it)->hi;
}

// Hangul syllables compose and decompose by arithmetic (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

void Decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out->push_back(kTBase + s % kTCount);
    return;
  }
  auto it = std::lower_bound(std::begin(kDecomposition), std::end(kDecomposition), cp,
                             [](const Decomposition& d, char32_t c) { return d.cp < c; });
  if (it == std::end(kDecomposition) || it->cp != cp) {
    out->push_back(cp);
    return;
  }
  out->insert(out->end(), kDecompositionPool + it->offset, kDecompositionPool + it->offset + it->length);
}

// The primary composite of (a, b), or 0.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = std::lower_bound(std::begin(kComposition), std::end(kComposition), std::pair{a, b},
                             [](const Composition& c, std::pair<char32_t, char32_t> k) {
                               return std::pair{c.first, c.second} < k;
                             });
  return it != std::end(kComposition) && it->first == a && it->second == b ? it->composite : 0;
}

// NFC of one run of valid code points.
void NfcRun(const std::vector<char32_t>& in, std::string* out) {
  std::vector<char32_t> d;
  for (char32_t cp : in) Decompose(cp, &d);
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (CombiningClass(d[i]) == 0) { ++i; continue; }
    size_t j = i;
    while (j < d.size() && CombiningClass(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j, [](char32_t a, char32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }
  // Canonical composition: each character joins the last starter unless blocked.
  std::vector<char32_t> c;
  int starter = -1, last_ccc = -1;
  for (char32_t cp : d) {
    const int ccc = CombiningClass(cp);
    if (starter >= 0 && (last_ccc < ccc || (last_ccc == 0 && static_cast<int>(c.size()) == starter + 1))) {
      if (char32_t k = Compose(c[starter], cp)) {
        c[starter] = k;
        continue;
      }
    }
    if (ccc == 0) starter = static_cast<int>(c.size());
    last_ccc = ccc;
    c.push_back(cp);
  }
  for (char32_t cp : c) AppendUtf8(cp, out);
}

}  // namespace

CodePoint DecodeOne(std::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return {b0, 1};
  int n;
  char32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) n = 2, cp = b0 & 0x1F, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0) n = 3, cp = b0 & 0x0F, min = 0x800;
  else if ((b0 & 0xF8) == 0xF0) n = 4, cp = b0 & 0x07, min = 0x10000;
  else return {0xFFFD, 1};
  if (static_cast<int>(s.size()) < n) return {0xFFFD, 1};
  for (int i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) != 0x80) return {0xFFFD, 1};
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return {0xFFFD, 1};
  return {cp, n};
}

std::vector<char32_t> DecodeUtf8(std::string_view s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) {
    const CodePoint c = DecodeOne(s.substr(i));
    out.push_back(c.cp);
    i += c.bytes;
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsLetter(char32_t cp) { return InRanges(kLetter, cp); }
bool IsNumber(char32_t cp) { return InRanges(kNumber, cp); }

bool IsWhitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

int CombiningClass(char32_t cp) {
  auto it = std::upper_bound(std::begin(kCombining), std::end(kCombining), cp,
                             [](char32_t c, const CombiningRange& r) { return c < r.lo; });
  return it != std::begin(kCombining) && cp <= std::prev(it)->hi ? std::prev(it)->ccc : 0;
}

std::string Nfc(std::string_view s) {
  // Fast path: ASCII is always NFC.
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return std::string(s);
  std::string out;
  out.reserve(s.size());
  std::vector<char32_t> run;
  for (size_t i = 0; i < s.size();) {
    const CodePoint c = DecodeOne(s.substr(i));
    if (c.cp == 0xFFFD && c.bytes == 1) {
      // A byte that is not UTF-8: close the run and keep the byte as it is.
      NfcRun(run, &out);
      run.clear();
      out.push_back(s[i]);
    } else {
      run.push_back(c.cp);
    }
    i += c.bytes;
  }
  NfcRun(run, &out);
  return out;
}

}  // namespace tessera::tokenizer
