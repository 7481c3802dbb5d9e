// What the tokenizers need of Unicode: UTF-8 decoding that never fails (an invalid byte
// is one code point, U+FFFD, one byte long — so that byte-level BPE can still encode it
// losslessly), the classes of the pre-tokenizer patterns (\p{L}, \p{N}, \s), and NFC
// (Qwen2's normalizer). The tables are generated (scripts/gen-unicode-tables.py).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::tokenizer {

// One code point of a UTF-8 string: its value and its byte length there.
struct CodePoint {
  char32_t cp;
  int bytes;
};
// The code point at the start of `s` (non-empty). Malformed, overlong, surrogate or
// truncated sequences give {U+FFFD, 1}.
CodePoint DecodeOne(std::string_view s);
std::vector<char32_t> DecodeUtf8(std::string_view s);
void AppendUtf8(char32_t cp, std::string* out);

bool IsLetter(char32_t cp);      // \p{L}
bool IsNumber(char32_t cp);      // \p{N}
bool IsWhitespace(char32_t cp);  // \s: the Unicode White_Space property
int CombiningClass(char32_t cp);

// Canonical composition (Unicode NFC). Bytes that are not UTF-8 pass through unchanged.
std::string Nfc(std::string_view s);

}  // namespace tessera::tokenizer
