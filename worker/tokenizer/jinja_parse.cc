// The template's parser: source -> segments (whitespace control applied) -> tree.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "common/status.h"
#include "worker/tokenizer/jinja_ast.h"
#include "worker/tokenizer/unicode.h"

namespace tessera::tokenizer {
namespace jinja {
namespace {

struct Token {
  enum Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
};

absl::StatusOr<std::vector<Token>> Lex(std::string_view s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (isspace(static_cast<unsigned char>(c))) { ++i; continue; }
    if (isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::kName, std::string(s.substr(i, j - i))});
      i = j;
    } else if (isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool flt = false;
      while (j < s.size() && (isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_' ||
                              (s[j] == '.' && j + 1 < s.size() && isdigit(static_cast<unsigned char>(s[j + 1]))) ||
                              ((s[j] == 'e' || s[j] == 'E') && j > i))) {
        if (s[j] == '.' || s[j] == 'e' || s[j] == 'E') flt = true;
        if ((s[j] == 'e' || s[j] == 'E') && j + 1 < s.size() && (s[j + 1] == '-' || s[j + 1] == '+')) ++j;
        ++j;
      }
      std::string num(s.substr(i, j - i));
      num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
      out.push_back({flt ? Token::kFloat : Token::kInt, num});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string str;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) { str += s[j]; continue; }
        const char e = s[++j];
        switch (e) {
          case 'n': str += '\n'; break;
          case 't': str += '\t'; break;
          case 'r': str += '\r'; break;
          case '0': str += '\0'; break;
          case 'u': {
            if (j + 4 >= s.size()) return Error(line, "a \\u escape needs four hex digits");
            const std::string hex(s.substr(j + 1, 4));
            if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
              return Error(line, "a \\u escape needs four hex digits");
            AppendUtf8(static_cast<char32_t>(std::strtoul(hex.c_str(), nullptr, 16)), &str);
            j += 4;
            break;
          }
          default: str += e;  // \\ \' \" and unknown escapes keep the character
        }
      }
      if (j >= s.size()) return Error(line, "a string literal is not closed");
      out.push_back({Token::kString, str});
      i = j + 1;
    } else {
      static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+", "-", "*", "/", "%", "~", "(", ")",
                                   "[", "]", "{", "}", ",", ".", ":", "|", "="};
      bool found = false;
      for (const char* op : kOps) {
        if (s.substr(i).rfind(op, 0) == 0) {
          out.push_back({Token::kOp, op});
          i += strlen(op);
          found = true;
          break;
        }
      }
      if (!found) return Error(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
  }
  out.push_back({Token::kEnd, ""});
  return out;
}

class ExprParser {
 public:
  ExprParser(std::vector<Token> t, int line) : t_(std::move(t)), line_(line) {}

  absl::StatusOr<ExprPtr> Parse() { return Conditional(); }
  // Nested expressions recurse: a bound keeps a hostile template from exhausting the stack.
  static constexpr int kMaxDepth = 64;
  absl::StatusOr<ExprPtr> ParseNoConditional() { return Or(); }  // a for loop's iterable (its `if` filters)
  bool AtEnd() const { return t_[p_].kind == Token::kEnd; }
  bool PeekName(const char* n) const { return t_[p_].kind == Token::kName && t_[p_].text == n; }
  bool AcceptName(const char* n) { return PeekName(n) ? (++p_, true) : false; }
  bool AcceptOp(const char* op) {
    if (t_[p_].kind == Token::kOp && t_[p_].text == op) return ++p_, true;
    return false;
  }
  absl::StatusOr<std::string> Name() {
    if (t_[p_].kind != Token::kName) return Error(line_, absl::StrCat("expected a name, found '", t_[p_].text, "'"));
    return t_[p_++].text;
  }
  absl::Status Expect(const char* op) {
    if (!AcceptOp(op)) return Error(line_, absl::StrCat("expected '", op, "', found '", t_[p_].text, "'"));
    return absl::OkStatus();
  }
  std::string Rest() const { return t_[p_].text; }

 private:
  ExprPtr Make(Expr::Kind k, std::string name = "") {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line_;
    e->name = std::move(name);
    return e;
  }
  ExprPtr Binary(std::string op, ExprPtr a, ExprPtr b) {
    auto e = Make(Expr::kBinary, std::move(op));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  absl::StatusOr<ExprPtr> Conditional() {
    if (++depth_ > kMaxDepth) return Error(line_, absl::StrCat("an expression nested deeper than ", kMaxDepth, " levels"));
    auto e = ConditionalBody();
    --depth_;
    return e;
  }
  absl::StatusOr<ExprPtr> ConditionalBody() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, Or());
    if (!AcceptName("if")) return e;
    TESSERA_ASSIGN_OR_RETURN(ExprPtr cond, Or());
    ExprPtr otherwise;
    if (AcceptName("else")) {
      TESSERA_ASSIGN_OR_RETURN(otherwise, Conditional());
    } else {
      otherwise = Make(Expr::kLiteral);
      otherwise->value = Undefined();
    }
    auto c = Make(Expr::kCond);
    c->args.push_back(std::move(e));
    c->args.push_back(std::move(cond));
    c->args.push_back(std::move(otherwise));
    return c;
  }
  absl::StatusOr<ExprPtr> Or() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, And());
    while (AcceptName("or")) {
      TESSERA_ASSIGN_OR_RETURN(ExprPtr r, And());
      e = Binary("or", std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> And() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, Not());
    while (AcceptName("and")) {
      TESSERA_ASSIGN_OR_RETURN(ExprPtr r, Not());
      e = Binary("and", std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> Not() {
    if (PeekName("not") && ++unary_ > kMaxDepth) return Error(line_, "too many 'not's in a row");
    if (AcceptName("not")) {
      TESSERA_ASSIGN_OR_RETURN(ExprPtr x, Not());
      auto e = Make(Expr::kNot);
      e->args.push_back(std::move(x));
      return e;
    }
    return Compare();
  }
  absl::StatusOr<ExprPtr> Compare() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, Additive());
    for (;;) {
      std::string op;
      for (const char* o : {"==", "!=", "<=", ">=", "<", ">"}) if (AcceptOp(o)) { op = o; break; }
      if (op.empty() && AcceptName("in")) op = "in";
      if (op.empty() && PeekName("not") && t_[p_ + 1].kind == Token::kName && t_[p_ + 1].text == "in") p_ += 2, op = "not in";
      if (op.empty()) return e;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr r, Additive());
      e = Binary(op, std::move(e), std::move(r));
    }
  }
  absl::StatusOr<ExprPtr> Additive() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, Concat());
    for (;;) {
      std::string op = AcceptOp("+") ? "+" : AcceptOp("-") ? "-" : "";
      if (op.empty()) return e;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr r, Concat());
      e = Binary(op, std::move(e), std::move(r));
    }
  }
  absl::StatusOr<ExprPtr> Concat() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, Multiplicative());
    while (AcceptOp("~")) {
      TESSERA_ASSIGN_OR_RETURN(ExprPtr r, Multiplicative());
      e = Binary("~", std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> Multiplicative() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, Power());
    for (;;) {
      std::string op;
      for (const char* o : {"//", "*", "/", "%"}) if (AcceptOp(o)) { op = o; break; }
      if (op.empty()) return e;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr r, Power());
      e = Binary(op, std::move(e), std::move(r));
    }
  }
  absl::StatusOr<ExprPtr> Power() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, Unary());
    while (AcceptOp("**")) {
      TESSERA_ASSIGN_OR_RETURN(ExprPtr r, Unary());
      e = Binary("**", std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> Unary() {
    if (t_[p_].kind == Token::kOp && (t_[p_].text == "-" || t_[p_].text == "+") && ++unary_ > kMaxDepth)
      return Error(line_, "too many signs in a row");
    if (AcceptOp("-")) {
      TESSERA_ASSIGN_OR_RETURN(ExprPtr x, Unary());
      auto e = Make(Expr::kNeg);
      e->args.push_back(std::move(x));
      return e;
    }
    if (AcceptOp("+")) return Unary();
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, Postfix());
    return Filters(std::move(e));
  }
  absl::Status Args(Expr* call) {  // after '('
    if (AcceptOp(")")) return absl::OkStatus();
    do {
      if (t_[p_].kind == Token::kName && t_[p_ + 1].kind == Token::kOp && t_[p_ + 1].text == "=") {
        std::string k = t_[p_].text;
        p_ += 2;
        TESSERA_ASSIGN_OR_RETURN(ExprPtr v, Conditional());
        call->kwargs.emplace_back(std::move(k), std::move(v));
      } else {
        TESSERA_ASSIGN_OR_RETURN(ExprPtr v, Conditional());
        call->args.push_back(std::move(v));
      }
    } while (AcceptOp(","));
    return Expect(")");
  }
  absl::StatusOr<ExprPtr> Filters(ExprPtr e) {
    for (;;) {
      if (AcceptOp("|")) {
        TESSERA_ASSIGN_OR_RETURN(std::string name, Name());
        auto f = Make(Expr::kFilter, name);
        f->args.push_back(std::move(e));
        if (AcceptOp("(")) TESSERA_RETURN_IF_ERROR(Args(f.get()));
        e = std::move(f);
      } else if (AcceptName("is")) {
        const bool negated = AcceptName("not");
        TESSERA_ASSIGN_OR_RETURN(std::string name, Name());
        auto t = Make(Expr::kTest, name);
        t->value = negated;
        t->args.push_back(std::move(e));
        if (AcceptOp("(")) {
          TESSERA_RETURN_IF_ERROR(Args(t.get()));
        } else if (name == "equalto" || name == "eq" || name == "sameas") {
          TESSERA_ASSIGN_OR_RETURN(ExprPtr arg, Additive());
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  absl::StatusOr<ExprPtr> Postfix() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, Primary());
    for (;;) {
      if (AcceptOp(".")) {
        TESSERA_ASSIGN_OR_RETURN(std::string name, Name());
        auto a = Make(Expr::kAttr, name);
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (AcceptOp("[")) {
        ExprPtr bounds[3];
        int colons = 0;
        for (;;) {
          if (t_[p_].kind == Token::kOp && (t_[p_].text == ":" || t_[p_].text == "]")) {
            if (AcceptOp("]")) break;
            AcceptOp(":");
            if (++colons > 2) return Error(line_, "a slice takes at most three parts");
            continue;
          }
          TESSERA_ASSIGN_OR_RETURN(bounds[colons], Conditional());
        }
        auto s = Make(colons ? Expr::kSlice : Expr::kIndex);
        s->args.push_back(std::move(e));
        for (int i = 0; i <= (colons ? 2 : 0); ++i) s->args.push_back(std::move(bounds[i]));
        if (!colons && !s->args[1]) return Error(line_, "empty subscript");
        e = std::move(s);
      } else if (AcceptOp("(")) {
        auto c = Make(Expr::kCall);
        c->args.push_back(std::move(e));
        TESSERA_RETURN_IF_ERROR(Args(c.get()));
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  absl::StatusOr<ExprPtr> Primary() {
    const Token t = t_[p_];
    if (t.kind == Token::kEnd) return Error(line_, "an expression ends too early");
    ++p_;
    if (t.kind == Token::kString) {
      auto e = Make(Expr::kLiteral);
      std::string s = t.text;
      while (t_[p_].kind == Token::kString) s += t_[p_++].text;  // adjacent literals join
      e->value = s;
      return e;
    }
    if (t.kind == Token::kInt || t.kind == Token::kFloat) {
      auto e = Make(Expr::kLiteral);
      if (t.kind == Token::kInt) {
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (ec != std::errc() || end != t.text.data() + t.text.size())
          return Error(line_, absl::StrCat("the integer ", t.text.substr(0, 40), " is out of range"));
        e->value = v;
      } else {
        e->value = std::strtod(t.text.c_str(), nullptr);  // (inf when out of range, as Python's float())
      }
      return e;
    }
    if (t.kind == Token::kName) {
      auto e = Make(Expr::kLiteral);
      if (t.text == "true" || t.text == "True") e->value = true;
      else if (t.text == "false" || t.text == "False") e->value = false;
      else if (t.text == "none" || t.text == "None") e->value = nullptr;
      else return Make(Expr::kName, t.text);
      return e;
    }
    if (t.text == "(") {
      TESSERA_ASSIGN_OR_RETURN(ExprPtr e, Conditional());
      TESSERA_RETURN_IF_ERROR(Expect(")"));
      return e;
    }
    if (t.text == "[") {
      auto e = Make(Expr::kList);
      if (!AcceptOp("]")) {
        do {
          if (t_[p_].kind == Token::kOp && t_[p_].text == "]") break;
          TESSERA_ASSIGN_OR_RETURN(ExprPtr x, Conditional());
          e->args.push_back(std::move(x));
        } while (AcceptOp(","));
        TESSERA_RETURN_IF_ERROR(Expect("]"));
      }
      return e;
    }
    if (t.text == "{") {
      auto e = Make(Expr::kDict);
      if (!AcceptOp("}")) {
        do {
          if (t_[p_].kind == Token::kOp && t_[p_].text == "}") break;
          TESSERA_ASSIGN_OR_RETURN(ExprPtr k, Conditional());
          TESSERA_RETURN_IF_ERROR(Expect(":"));
          TESSERA_ASSIGN_OR_RETURN(ExprPtr v, Conditional());
          e->args.push_back(std::move(k));
          e->args.push_back(std::move(v));
        } while (AcceptOp(","));
        TESSERA_RETURN_IF_ERROR(Expect("}"));
      }
      return e;
    }
    return Error(line_, absl::StrCat("unexpected '", t.text, "'"));
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0, unary_ = 0;
};



// A piece of the source: text, or the inside of a {{ }} / {% %} tag (comments dropped).
struct Segment {
  enum Kind { kText, kOutput, kStatement } kind;
  std::string text;
  int line;
};

// Splits the source into segments and applies whitespace control the way Jinja with
// trim_blocks and lstrip_blocks does: "-" strips all whitespace on that side; a block or
// comment tag (unless "+") also takes the spaces and tabs before it on its line, and the
// one newline right after it.
absl::StatusOr<std::vector<Segment>> Segments(std::string_view src) {
  std::vector<Segment> out;
  size_t pos = 0;
  int line = 1;
  bool trim_next_newline = false, strip_next = false;
  auto count_lines = [&](size_t a, size_t b) { line += static_cast<int>(std::count(src.begin() + a, src.begin() + b, '\n')); };
  while (pos <= src.size()) {
    size_t at = pos;
    while (at + 1 < src.size() && !(src[at] == '{' && (src[at + 1] == '{' || src[at + 1] == '%' || src[at + 1] == '#'))) ++at;
    if (at + 1 >= src.size()) at = src.size();
    std::string text(src.substr(pos, at - pos));
    const int text_line = line;
    count_lines(pos, at);
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && isspace(static_cast<unsigned char>(text[k]))) ++k;
      text.erase(0, k);
    } else if (trim_next_newline) {
      if (text.rfind("\r\n", 0) == 0) text.erase(0, 2);
      else if (!text.empty() && text[0] == '\n') text.erase(0, 1);
    }
    if (at == src.size()) {
      out.push_back({Segment::kText, text, text_line});
      break;
    }
    const char open = src[at + 1];
    const char close = open == '{' ? '}' : open;
    size_t inner = at + 2;
    const bool minus_before = inner < src.size() && src[inner] == '-';
    const bool plus_before = inner < src.size() && src[inner] == '+';
    if (minus_before || plus_before) ++inner;
    // The end of the tag, skipping string literals in expressions.
    size_t end = inner;
    char quote = 0;
    for (; end + 1 < src.size(); ++end) {
      if (open != '#' && quote == 0 && (src[end] == '\'' || src[end] == '"')) quote = src[end];
      else if (quote != 0 && src[end] == '\\') ++end;
      else if (quote != 0 && src[end] == quote) quote = 0;
      else if (quote == 0 && src[end] == close && src[end + 1] == '}') break;
    }
    if (end + 1 >= src.size()) return Error(line, absl::StrCat("a '{", std::string(1, open), "' tag is not closed"));
    const bool minus_after = end > inner && src[end - 1] == '-';
    std::string body(src.substr(inner, end - inner - (minus_after ? 1 : 0)));
    if (minus_before) {
      while (!text.empty() && isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    } else if (open != '{' && !plus_before) {
      // lstrip_blocks: the spaces and tabs between the start of the source line and the tag.
      size_t k = at;
      while (k > pos && (src[k - 1] == ' ' || src[k - 1] == '\t')) --k;
      if (k == 0 || (k > pos && src[k - 1] == '\n')) {
        size_t n = 0;
        while (n < at - k && n < text.size() && (text[text.size() - 1 - n] == ' ' || text[text.size() - 1 - n] == '\t')) ++n;
        text.resize(text.size() - n);
      }
    }
    out.push_back({Segment::kText, text, text_line});
    const int tag_line = line;
    count_lines(at, end + 2);
    if (open == '{') out.push_back({Segment::kOutput, body, tag_line});
    else if (open == '%') out.push_back({Segment::kStatement, body, tag_line});
    strip_next = minus_after;
    trim_next_newline = open != '{';
    pos = end + 2;
  }
  return out;
}



absl::StatusOr<ExprPtr> ParseWhole(const std::string& text, int line) {
  TESSERA_ASSIGN_OR_RETURN(auto tokens, Lex(text, line));
  ExprParser p(std::move(tokens), line);
  TESSERA_ASSIGN_OR_RETURN(ExprPtr e, p.Parse());
  if (!p.AtEnd()) return Error(line, absl::StrCat("unexpected '", p.Rest(), "' after an expression"));
  return e;
}

class StatementParser {
 public:
  explicit StatementParser(std::vector<Segment> s) : segs_(std::move(s)) {}

  // Parses nodes into `body` until a statement whose keyword is in `ends` (returned, with
  // its parser positioned after the keyword) or the end of the source.
  absl::Status ParseBody(JinjaTemplate::Body* body, const std::vector<std::string>& ends, std::string* ended,
                         std::unique_ptr<ExprParser>* end_parser, int* end_line) {
    while (i_ < segs_.size()) {
      const Segment& seg = segs_[i_++];
      if (seg.kind == Segment::kText) {
        if (!seg.text.empty()) body->nodes.push_back(Node{Node::kText, seg.line, seg.text});
        continue;
      }
      if (seg.kind == Segment::kOutput) {
        Node n{Node::kOutput, seg.line};
        TESSERA_ASSIGN_OR_RETURN(ExprPtr e, ParseWhole(seg.text, seg.line));
        n.exprs.push_back(std::move(e));
        body->nodes.push_back(std::move(n));
        continue;
      }
      TESSERA_ASSIGN_OR_RETURN(auto tokens, Lex(seg.text, seg.line));
      auto p = std::make_unique<ExprParser>(std::move(tokens), seg.line);
      TESSERA_ASSIGN_OR_RETURN(std::string kw, p->Name());
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        *ended = kw;
        *end_parser = std::move(p);
        *end_line = seg.line;
        return absl::OkStatus();
      }
      TESSERA_RETURN_IF_ERROR(Statement(kw, *p, seg.line, body));
    }
    if (!ends.empty()) return absl::InvalidArgumentError(absl::StrCat("template: the source ends before {% ", ends.back(), " %}"));
    return absl::OkStatus();
  }

 private:
  absl::Status End(ExprParser& p, int line, const std::string& what) {
    if (!p.AtEnd()) return Error(line, absl::StrCat("unexpected '", p.Rest(), "' in {% ", what, " %}"));
    return absl::OkStatus();
  }

  absl::Status Statement(const std::string& kw, ExprParser& p, int line, JinjaTemplate::Body* body) {
    if ((kw == "if" || kw == "for") && nesting_ >= 64) return Error(line, "blocks nested deeper than 64 levels");
    struct Nest {
      int& n;
      explicit Nest(int& x) : n(++x) {}
      ~Nest() { --n; }
    } nest(nesting_);
    std::string ended;
    std::unique_ptr<ExprParser> ep;
    int end_line = 0;
    if (kw == "if") {
      Node n{Node::kIf, line};
      TESSERA_ASSIGN_OR_RETURN(ExprPtr cond, p.Parse());
      TESSERA_RETURN_IF_ERROR(End(p, line, "if"));
      n.exprs.push_back(std::move(cond));
      for (;;) {
        n.bodies.emplace_back();
        TESSERA_RETURN_IF_ERROR(ParseBody(&n.bodies.back(), {"elif", "else", "endif"}, &ended, &ep, &end_line));
        if (ended == "elif") {
          TESSERA_ASSIGN_OR_RETURN(ExprPtr c, ep->Parse());
          TESSERA_RETURN_IF_ERROR(End(*ep, end_line, "elif"));
          n.exprs.push_back(std::move(c));
          continue;
        }
        TESSERA_RETURN_IF_ERROR(End(*ep, end_line, ended));
        if (ended == "else") {
          n.bodies.emplace_back();
          TESSERA_RETURN_IF_ERROR(ParseBody(&n.bodies.back(), {"endif"}, &ended, &ep, &end_line));
          TESSERA_RETURN_IF_ERROR(End(*ep, end_line, "endif"));
        }
        break;
      }
      body->nodes.push_back(std::move(n));
    } else if (kw == "for") {
      Node n{Node::kFor, line};
      do {
        TESSERA_ASSIGN_OR_RETURN(std::string v, p.Name());
        n.vars.push_back(v);
      } while (p.AcceptOp(","));
      if (!p.AcceptName("in")) return Error(line, "expected 'in' in {% for %}");
      TESSERA_ASSIGN_OR_RETURN(ExprPtr it, p.ParseNoConditional());
      n.exprs.push_back(std::move(it));
      if (p.AcceptName("if")) {  // a filter: items for which it is false are skipped
        TESSERA_ASSIGN_OR_RETURN(ExprPtr cond, p.ParseNoConditional());
        n.exprs.push_back(std::move(cond));
      }
      if (p.PeekName("recursive")) return Error(line, "recursive loops are not supported");
      TESSERA_RETURN_IF_ERROR(End(p, line, "for"));
      n.bodies.emplace_back();
      TESSERA_RETURN_IF_ERROR(ParseBody(&n.bodies.back(), {"else", "endfor"}, &ended, &ep, &end_line));
      TESSERA_RETURN_IF_ERROR(End(*ep, end_line, ended));
      if (ended == "else") {
        n.bodies.emplace_back();
        TESSERA_RETURN_IF_ERROR(ParseBody(&n.bodies.back(), {"endfor"}, &ended, &ep, &end_line));
        TESSERA_RETURN_IF_ERROR(End(*ep, end_line, "endfor"));
      }
      body->nodes.push_back(std::move(n));
    } else if (kw == "set") {
      Node n{Node::kSet, line};
      TESSERA_ASSIGN_OR_RETURN(n.text, p.Name());
      if (p.AcceptOp(".")) {
        TESSERA_ASSIGN_OR_RETURN(n.attr, p.Name());
      }
      if (!p.AcceptOp("=")) return Error(line, "only {% set name = value %} is supported (not block sets)");
      TESSERA_ASSIGN_OR_RETURN(ExprPtr v, p.Parse());
      TESSERA_RETURN_IF_ERROR(End(p, line, "set"));
      n.exprs.push_back(std::move(v));
      body->nodes.push_back(std::move(n));
    } else if (kw == "break" || kw == "continue") {
      TESSERA_RETURN_IF_ERROR(End(p, line, kw));
      body->nodes.push_back(Node{kw == "break" ? Node::kBreak : Node::kContinue, line});
    } else if (kw == "generation" || kw == "endgeneration") {
      // transformers' AssistantTracker marks: they change no text.
    } else {
      return Error(line, absl::StrCat("{% ", kw, " %} is not supported in chat templates here"));
    }
    return absl::OkStatus();
  }

  std::vector<Segment> segs_;
  size_t i_ = 0;
  int nesting_ = 0;
};

}  // namespace
}  // namespace jinja

JinjaTemplate::JinjaTemplate(JinjaTemplate&&) noexcept = default;
JinjaTemplate& JinjaTemplate::operator=(JinjaTemplate&&) noexcept = default;
JinjaTemplate::~JinjaTemplate() = default;

absl::StatusOr<JinjaTemplate> JinjaTemplate::Parse(std::string_view source) {
  using namespace jinja;
  // Jinja drops one newline at the end of the source (keep_trailing_newline=False).
  if (source.size() >= 2 && source.substr(source.size() - 2) == "\r\n") source.remove_suffix(2);
  else if (!source.empty() && source.back() == '\n') source.remove_suffix(1);
  TESSERA_ASSIGN_OR_RETURN(auto segs, Segments(source));
  StatementParser p(std::move(segs));
  JinjaTemplate t;
  t.root_ = std::make_unique<Body>();
  std::string ended;
  std::unique_ptr<ExprParser> ep;
  int line = 0;
  TESSERA_RETURN_IF_ERROR(p.ParseBody(t.root_.get(), {}, &ended, &ep, &line));
  return t;
}

}  // namespace tessera::tokenizer
