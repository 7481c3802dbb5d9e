#include "worker/tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/tokenizer/pretokenize.h"
#include "worker/tokenizer/unicode.h"

namespace tessera::tokenizer {
namespace {

using Json = nlohmann::json;

class ByteTokenizer final : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool) const override {
    std::string out;
    out.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || id > 255) return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not a byte (0..255)"));
      out.push_back(static_cast<char>(id));
    }
    return out;
  }
  int64_t vocab_size() const override { return 256; }
  std::optional<int32_t> SpecialId(std::string_view) const override { return std::nullopt; }
  bool IsSpecial(int32_t) const override { return false; }
  std::string name() const override { return "byte"; }
};

// GPT-2's reversible map of bytes to printable code points: bytes that print stand for
// themselves, the others take 256, 257, ... in order.
struct ByteMap {
  std::string to_unicode[256];           // byte -> its code point, UTF-8
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool prints = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = prints ? b : 256 + n++;
      AppendUtf8(cp, &to_unicode[b]);
      to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& Bytes() {
  static const ByteMap m;
  return m;
}

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip, single_word;
};

class BpeTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(const Json& j, const std::string& file);

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool skip_special) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::optional<int32_t> SpecialId(std::string_view content) const override {
    for (const auto& a : added_) if (a.content == content) return a.id;
    return std::nullopt;
  }
  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < static_cast<int32_t>(special_.size()) && special_[id];
  }
  std::string name() const override { return name_; }

 private:
  absl::Status EncodeText(std::string_view text, std::vector<int32_t>* out) const;
  absl::Status EncodePiece(std::string_view piece, std::vector<int32_t>* out) const;

  std::string name_;
  std::vector<std::string> tokens_;                // id -> vocabulary string ("" for holes)
  std::vector<bool> special_, added_id_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left, right) -> (rank, merged id)
  std::vector<AddedToken> added_;                  // longest first
  bool nfc_ = false, ignore_merges_ = false, add_prefix_space_ = false;
  SplitPattern pattern_ = SplitPattern::kGpt2;
  std::vector<int32_t> prefix_, suffix_;           // TemplateProcessing's single sequence
  int32_t byte_id_[256] = {};                      // each byte's own token
  bool added_first_[256] = {};                     // bytes an added token starts with
};

uint64_t PairKey(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

absl::Status Unsupported(const std::string& file, const std::string& field, const std::string& what) {
  return absl::UnimplementedError(absl::StrCat(file, ": ", field, " ", what, " is not supported (byte-level BPE of the GPT-2, Llama-3 and Qwen2 kind is)"));
}

// The pre-tokenizer: ByteLevel(use_regex) alone (GPT-2), or Sequence[Split(Regex,
// Isolated), ByteLevel(use_regex=false)] (Llama-3, Qwen2).
absl::Status ReadPreTokenizer(const Json& p, const std::string& file, SplitPattern* pattern, bool* prefix_space) {
  auto byte_level = [&](const Json& b, bool want_regex) -> absl::Status {
    if (b.value("use_regex", true) != want_regex)
      return Unsupported(file, "pre_tokenizer ByteLevel.use_regex", want_regex ? "false" : "true after a Split");
    *prefix_space = b.value("add_prefix_space", false);
    return absl::OkStatus();
  };
  const std::string type = p.is_object() ? p.value("type", "") : "";
  if (type == "ByteLevel") {
    *pattern = SplitPattern::kGpt2;
    return byte_level(p, true);
  }
  if (type != "Sequence") return Unsupported(file, "pre_tokenizer.type", type.empty() ? "null" : type);
  const Json& seq = p.value("pretokenizers", Json::array());
  if (seq.size() != 2 || seq[0].value("type", "") != "Split" || seq[1].value("type", "") != "ByteLevel")
    return Unsupported(file, "pre_tokenizer", "Sequence other than [Split, ByteLevel]");
  const Json& split = seq[0];
  if (!split.contains("pattern") || !split["pattern"].is_object() || !split["pattern"].contains("Regex") ||
      !split["pattern"]["Regex"].is_string())
    return absl::InvalidArgumentError(absl::StrCat(file, ": pre_tokenizer Split.pattern: expected {\"Regex\": string}"));
  if (split.value("behavior", "") != "Isolated" || split.value("invert", false))
    return Unsupported(file, "pre_tokenizer Split.behavior", split.value("behavior", "") + (split.value("invert", false) ? " inverted" : ""));
  auto pat = PatternFromRegex(split["pattern"]["Regex"].get<std::string>());
  if (!pat.ok()) return absl::UnimplementedError(absl::StrCat(file, ": ", pat.status().message()));
  *pattern = *pat;
  return byte_level(seq[1], false);
}

absl::Status ReadNormalizer(const Json& n, const std::string& file, bool* nfc) {
  if (n.is_null()) return absl::OkStatus();
  const std::string type = n.value("type", "");
  if (type == "NFC") {
    *nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    for (const auto& x : n.value("normalizers", Json::array())) TESSERA_RETURN_IF_ERROR(ReadNormalizer(x, file, nfc));
    return absl::OkStatus();
  }
  return Unsupported(file, "normalizer.type", type);
}

// TemplateProcessing's `single`: the special tokens before and after the sequence.
absl::Status ReadPostProcessor(const Json& p, const std::string& file, std::vector<int32_t>* prefix,
                               std::vector<int32_t>* suffix) {
  if (p.is_null()) return absl::OkStatus();
  const std::string type = p.value("type", "");
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "Sequence") {
    for (const auto& x : p.value("processors", Json::array()))
      TESSERA_RETURN_IF_ERROR(ReadPostProcessor(x, file, prefix, suffix));
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") return Unsupported(file, "post_processor.type", type);
  bool seen_sequence = false;
  const Json specials = p.value("special_tokens", Json::object());
  for (const auto& item : p.value("single", Json::array())) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id"))
      return absl::InvalidArgumentError(absl::StrCat(file, ": post_processor.single: expected Sequence or SpecialToken items"));
    const std::string name = item["SpecialToken"]["id"];
    if (!specials.contains(name) || !specials[name].contains("ids"))
      return absl::InvalidArgumentError(absl::StrCat(file, ": post_processor.special_tokens has no ids for ", name));
    for (const auto& id : specials[name]["ids"]) (seen_sequence ? suffix : prefix)->push_back(id.get<int32_t>());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(const Json& j, const std::string& file) {
  auto t = std::unique_ptr<BpeTokenizer>(new BpeTokenizer());
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    return absl::InvalidArgumentError(absl::StrCat(file, ": expected a tokenizer.json object with a \"model\""));
  const Json& m = j["model"];
  if (m.value("type", "BPE") != "BPE") return Unsupported(file, "model.type", m.value("type", ""));
  if (m.value("byte_fallback", false)) return Unsupported(file, "model.byte_fallback", "true");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && m[k] != "") return Unsupported(file, absl::StrCat("model.", k), m[k].dump());
  if (!m.contains("vocab") || !m["vocab"].is_object()) return absl::InvalidArgumentError(absl::StrCat(file, ": model.vocab: expected an object"));
  t->ignore_merges_ = m.value("ignore_merges", false);
  int32_t max_id = -1;
  for (const auto& [tok, id] : m["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 30))
      return absl::InvalidArgumentError(absl::StrCat(file, ": model.vocab[", Json(tok).dump(), "]: expected an id in [0, 2^30)"));
    t->vocab_[tok] = id.get<int32_t>();
    max_id = std::max(max_id, id.get<int32_t>());
  }
  for (const auto& a : j.value("added_tokens", Json::array())) {
    if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") || !a["content"].is_string() ||
        a["content"].get<std::string>().empty() || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() >= (1 << 30))
      return absl::InvalidArgumentError(absl::StrCat(file, ": added_tokens: expected {\"id\": int, \"content\": non-empty string}, got ", a.dump()));
    t->added_.push_back({a["content"], a["id"].get<int32_t>(), a.value("special", false), a.value("lstrip", false),
                         a.value("rstrip", false), a.value("single_word", false)});
    max_id = std::max(max_id, a["id"].get<int32_t>());
  }
  std::stable_sort(t->added_.begin(), t->added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  t->tokens_.assign(max_id + 1, "");
  t->special_.assign(max_id + 1, false);
  t->added_id_.assign(max_id + 1, false);
  for (const auto& [tok, id] : t->vocab_) t->tokens_[id] = tok;
  for (const auto& a : t->added_) {
    t->tokens_[a.id] = a.content;
    t->special_[a.id] = a.special;
    t->added_id_[a.id] = true;
  }
  const Json merges = m.value("merges", Json::array());
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string left, right;
    if (merges[r].is_string()) {  // "a b"
      const std::string s = merges[r];
      const auto sp = s.find(' ');
      if (sp == std::string::npos) return absl::InvalidArgumentError(absl::StrCat(file, ": model.merges[", r, "]: expected \"left right\""));
      left = s.substr(0, sp), right = s.substr(sp + 1);
    } else if (merges[r].is_array() && merges[r].size() == 2 && merges[r][0].is_string() && merges[r][1].is_string()) {
      left = merges[r][0], right = merges[r][1];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(file, ": model.merges[", r, "]: expected \"left right\" or [left, right]"));
    }
    auto l = t->vocab_.find(left), rt = t->vocab_.find(right), lr = t->vocab_.find(left + right);
    if (l == t->vocab_.end() || rt == t->vocab_.end() || lr == t->vocab_.end())
      return absl::InvalidArgumentError(absl::StrCat(file, ": model.merges[", r, "]: ", Json(left + " " + right).dump(),
                                                     " has a part or a result that is not in model.vocab"));
    t->merges_.emplace(PairKey(l->second, rt->second), std::pair<int32_t, int32_t>(static_cast<int32_t>(r), lr->second));
  }
  for (int b = 0; b < 256; ++b) {
    auto it = t->vocab_.find(Bytes().to_unicode[b]);
    if (it == t->vocab_.end())
      return absl::InvalidArgumentError(absl::StrCat(file, ": model.vocab lacks the byte-level token of byte ", b,
                                                     " (", Json(Bytes().to_unicode[b]).dump(), ")"));
    t->byte_id_[b] = it->second;
  }
  for (const auto& a : t->added_) t->added_first_[static_cast<unsigned char>(a.content[0])] = true;
  TESSERA_RETURN_IF_ERROR(ReadNormalizer(j.value("normalizer", Json()), file, &t->nfc_));
  TESSERA_RETURN_IF_ERROR(ReadPreTokenizer(j.value("pre_tokenizer", Json()), file, &t->pattern_, &t->add_prefix_space_));
  TESSERA_RETURN_IF_ERROR(ReadPostProcessor(j.value("post_processor", Json()), file, &t->prefix_, &t->suffix_));
  const Json dec = j.value("decoder", Json());
  if (!dec.is_null() && dec.value("type", "") != "ByteLevel") return Unsupported(file, "decoder.type", dec.value("type", ""));
  for (int32_t id : t->prefix_) if (id < 0 || id > max_id) return absl::InvalidArgumentError(absl::StrCat(file, ": post_processor id ", id, " is out of the vocabulary"));
  for (int32_t id : t->suffix_) if (id < 0 || id > max_id) return absl::InvalidArgumentError(absl::StrCat(file, ": post_processor id ", id, " is out of the vocabulary"));
  const char* kinds[] = {"gpt2", "llama3", "qwen2"};
  t->name_ = absl::StrCat("bpe:", kinds[static_cast<int>(t->pattern_)], t->nfc_ ? "+nfc" : "", " (", t->tokens_.size(), " tokens)");
  return t;
}

absl::Status BpeTokenizer::EncodePiece(std::string_view piece, std::vector<int32_t>* out) const {
  std::string mapped;
  for (unsigned char c : piece) mapped += Bytes().to_unicode[c];
  if (ignore_merges_) {
    auto it = vocab_.find(mapped);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return absl::OkStatus();
    }
  }
  struct Symbol {
    int32_t id;
    int prev, next;
  };
  std::vector<Symbol> sym;
  for (size_t i = 0; i < piece.size(); ++i)
    sym.push_back({byte_id_[static_cast<unsigned char>(piece[i])], static_cast<int>(i) - 1,
                   i + 1 < piece.size() ? static_cast<int>(i) + 1 : -1});
  // Lowest rank first, leftmost among equal ranks (Hugging Face's order); a popped pair
  // whose symbols changed since it was pushed is stale.
  struct Cand {
    int32_t rank;
    int pos;
    int32_t left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
  auto push = [&](int p) {
    if (p < 0 || sym[p].next < 0) return;
    auto it = merges_.find(PairKey(sym[p].id, sym[sym[p].next].id));
    if (it != merges_.end()) q.push({it->second.first, p, sym[p].id, sym[sym[p].next].id});
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i) push(static_cast<int>(i));
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    Symbol& l = sym[c.pos];
    if (l.id != c.left || l.next < 0 || sym[l.next].id != c.right) continue;
    l.id = merges_.at(PairKey(c.left, c.right)).second;
    const int dead = l.next;
    l.next = sym[dead].next;
    if (l.next >= 0) sym[l.next].prev = c.pos;
    sym[dead].id = -1;
    push(l.prev);
    push(c.pos);
  }
  for (int p = sym.empty() ? -1 : 0; p >= 0; p = sym[p].next) out->push_back(sym[p].id);
  return absl::OkStatus();
}

absl::Status BpeTokenizer::EncodeText(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return absl::OkStatus();
  std::string normalized = nfc_ ? Nfc(text) : std::string(text);
  if (add_prefix_space_ && normalized[0] != ' ') normalized.insert(0, " ");
  for (std::string_view piece : PreTokenize(pattern_, normalized)) TESSERA_RETURN_IF_ERROR(EncodePiece(piece, out));
  return absl::OkStatus();
}

bool WordChar(std::string_view s, bool last) {
  if (s.empty()) return false;
  if (last) {
    size_t i = s.size() - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    s = s.substr(i);
  }
  const char32_t cp = DecodeOne(s).cp;
  return IsLetter(cp) || IsNumber(cp) || cp == '_';
}

// Whitespace at the end (or start) of s: its length in bytes.
size_t SpaceRun(std::string_view s, bool at_end) {
  size_t n = 0;
  if (at_end) {
    while (n < s.size()) {
      size_t i = s.size() - n - 1;
      while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
      const CodePoint c = DecodeOne(s.substr(i));
      if (!IsWhitespace(c.cp) || i + c.bytes != s.size() - n) break;
      n = s.size() - i;
    }
  } else {
    while (n < s.size()) {
      const CodePoint c = DecodeOne(s.substr(n));
      if (!IsWhitespace(c.cp)) break;
      n += c.bytes;
    }
  }
  return n;
}

absl::StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> out;
  if (add_special) out = prefix_;
  // Added tokens split the text first: at each position the longest that matches.
  size_t start = 0;  // of the text not yet encoded
  for (size_t i = 0; i < text.size();) {
    if (!added_first_[static_cast<unsigned char>(text[i])]) {  // most bytes start no added token
      ++i;
      continue;
    }
    const AddedToken* hit = nullptr;
    for (const auto& a : added_) {
      if (text.compare(i, a.content.size(), a.content) != 0) continue;
      if (a.single_word && (WordChar(text.substr(0, i), true) || WordChar(text.substr(i + a.content.size()), false))) continue;
      hit = &a;
      break;
    }
    if (!hit) {
      ++i;
      continue;
    }
    std::string_view before = text.substr(start, i - start);
    if (hit->lstrip) before.remove_suffix(SpaceRun(before, true));
    TESSERA_RETURN_IF_ERROR(EncodeText(before, &out));
    out.push_back(hit->id);
    i += hit->content.size();
    if (hit->rstrip) i += SpaceRun(text.substr(i), false);
    start = i;
  }
  TESSERA_RETURN_IF_ERROR(EncodeText(text.substr(start), &out));
  if (add_special) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

absl::StatusOr<std::string> BpeTokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(tokens_.size()) || (tokens_[id].empty() && !added_id_[id]))
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary of ", name_));
    if (added_id_[id]) {
      if (!(skip_special && special_[id])) out += tokens_[id];
      continue;
    }
    const std::string& tok = tokens_[id];
    for (size_t i = 0; i < tok.size();) {
      const CodePoint c = DecodeOne(std::string_view(tok).substr(i));
      auto b = Bytes().to_byte.find(c.cp);
      if (b != Bytes().to_byte.end()) out.push_back(static_cast<char>(b->second));
      else out.append(tok, i, c.bytes);  // not a byte-level character: kept as text
      i += c.bytes;
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path) {
  std::string file = path;
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) file = path + "/tokenizer.json";
  auto text = ReadFile(file);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("tokenizer ", file, ": ", text.status().message()));
  Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(file, ": not JSON"));
  try {
    TESSERA_ASSIGN_OR_RETURN(auto t, BpeTokenizer::FromJson(j, file));
    return std::unique_ptr<Tokenizer>(std::move(t));
  } catch (const Json::exception& e) {  // a field of the wrong JSON type
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", e.what()));
  }
}

}  // namespace tessera::tokenizer
