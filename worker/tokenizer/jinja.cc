#include "worker/tokenizer/jinja.h"
#include "worker/tokenizer/jinja_ast.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/tokenizer/unicode.h"

namespace tessera::tokenizer {

namespace jinja {
namespace {

// ---------------------------------------------------------------- values as Python shows them

std::string PyFloat(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[48];
  for (int prec = 1; prec <= 17; ++prec) {
    snprintf(buf, sizeof(buf), "%.*e", prec - 1, v);
    if (strtod(buf, nullptr) == v) break;
  }
  std::string s = buf, sign;
  if (s[0] == '-') sign = "-", s = s.substr(1);
  const auto e = s.find('e');
  std::string digits = s.substr(0, e);
  const int exp = std::atoi(s.c_str() + e + 1);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char ebuf[16];
    snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + m + ebuf;
  }
  if (exp < 0) return sign + "0." + std::string(-exp - 1, '0') + digits;
  std::string ip = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
  ip += std::string(exp + 1 - ip.size(), '0');
  std::string fp = digits.size() > static_cast<size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
  return sign + ip + "." + fp;
}

std::string PyRepr(const Json& v);

std::string PyStrRepr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == q) out += std::string("\\") + static_cast<char>(q);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) { char b[8]; snprintf(b, sizeof(b), "\\x%02x", c); out += b; }
    else out += static_cast<char>(c);
  }
  return out + q;
}

std::string PyRepr(const Json& v) {
  if (v.is_string()) return PyStrRepr(v.get<std::string>());
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + PyRepr(v[i]);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, x] : v.items()) out += (first ? "" : ", ") + PyStrRepr(k) + ": " + PyRepr(x), first = false;
    return out + "}";
  }
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_float()) return PyFloat(v.get<double>());
  if (v.is_number()) return v.dump();
  return "";
}

std::string ToString(const Json& v) {
  if (IsUndefined(v)) return "";
  if (v.is_string()) return v.get<std::string>();
  return PyRepr(v);
}

// json.dumps(v, ensure_ascii=False, indent=indent) — transformers' tojson.
void Dumps(const Json& v, int indent, int depth, std::string* out) {
  auto nl = [&](int d) {
    if (indent < 0) return;
    *out += "\n";
    *out += std::string(indent * d, ' ');
  };
  if (v.is_object() || v.is_array()) {
    const bool obj = v.is_object();
    if (v.empty()) { *out += obj ? "{}" : "[]"; return; }
    *out += obj ? "{" : "[";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) *out += indent < 0 ? ", " : ",";
      first = false;
      nl(depth + 1);
      if (obj) {
        Dumps(Json(it.key()), indent, depth + 1, out);
        *out += ": ";
      }
      Dumps(*it, indent, depth + 1, out);
    }
    nl(depth);
    *out += obj ? "}" : "]";
  } else if (v.is_string()) {
    *out += '"';
    for (unsigned char c : v.get<std::string>()) {
      if (c == '"') *out += "\\\"";
      else if (c == '\\') *out += "\\\\";
      else if (c == '\n') *out += "\\n";
      else if (c == '\r') *out += "\\r";
      else if (c == '\t') *out += "\\t";
      else if (c == '\b') *out += "\\b";
      else if (c == '\f') *out += "\\f";
      else if (c < 0x20) { char b[8]; snprintf(b, sizeof(b), "\\u%04x", c); *out += b; }
      else *out += static_cast<char>(c);
    }
    *out += '"';
  } else if (v.is_boolean()) {
    *out += v.get<bool>() ? "true" : "false";
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    *out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : PyFloat(d);
  } else if (v.is_number()) {
    *out += v.dump();
  } else {
    *out += "null";
  }
}

constexpr uint64_t kMaxString = 16 << 20;  // what one string operation or the output may grow to

bool Truthy(const Json& v) {
  if (IsUndefined(v) || v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_float()) return v.get<double>() != 0;
  if (v.is_number()) return v.get<int64_t>() != 0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();  // (json::empty() is false for any string)
  if (v.is_array() || v.is_object()) return !v.empty();
  return false;
}

bool PySpace(char32_t c) { return IsWhitespace(c) || (c >= 0x1C && c <= 0x1F); }

std::string StripChars(const std::string& s, bool left, bool right, const Json& chars) {
  std::vector<char32_t> cps = DecodeUtf8(s), set;
  if (chars.is_string()) set = DecodeUtf8(chars.get<std::string>());
  auto strip = [&](char32_t c) { return chars.is_string() ? std::find(set.begin(), set.end(), c) != set.end() : PySpace(c); };
  size_t a = 0, b = cps.size();
  if (left) while (a < b && strip(cps[a])) ++a;
  if (right) while (b > a && strip(cps[b - 1])) --b;
  std::string out;
  for (size_t i = a; i < b; ++i) AppendUtf8(cps[i], &out);
  return out;
}

std::string AsciiCase(std::string s, int how) {  // 1 upper, -1 lower
  for (char& c : s) c = how > 0 ? static_cast<char>(toupper(static_cast<unsigned char>(c))) : static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return s;
}

// ---------------------------------------------------------------- evaluation

size_t CodePoints(const std::string& s) { return DecodeUtf8(s).size(); }

// Python's ints are unbounded; ours are 64 bits: arithmetic past them is an error, and a
// float too large for an int is clamped (converting it as it is would be undefined).
int64_t ToInt(const Json& v) {
  if (!v.is_number_float()) return v.get<int64_t>();
  const double d = v.get<double>();
  if (std::isnan(d)) return 0;
  if (d >= 9.2e18) return INT64_MAX;
  if (d <= -9.2e18) return INT64_MIN;
  return static_cast<int64_t>(d);
}

class Renderer {
 public:
  explicit Renderer(const Json& vars) {
    scopes_.emplace_back();
    for (const auto& [k, v] : vars.items()) scopes_[0][k] = v;
  }
  std::string& out() { return out_; }

  enum Flow { kNormal, kBreak, kContinue };

  absl::StatusOr<Flow> Exec(const JinjaTemplate::Body& body) {
    for (const Node& n : body.nodes) {
      switch (n.kind) {
        case Node::kText:
          out_ += n.text;
          if (out_.size() > kMaxString) return Error(n.line, "the rendered text passed 16 MiB");
          break;
        case Node::kOutput: {
          TESSERA_ASSIGN_OR_RETURN(Json v, Eval(*n.exprs[0]));
          out_ += ToString(v);
          if (out_.size() > kMaxString) return Error(n.line, "the rendered text passed 16 MiB");
          break;
        }
        case Node::kIf: {
          size_t taken = n.bodies.size();
          for (size_t c = 0; c < n.exprs.size(); ++c) {
            TESSERA_ASSIGN_OR_RETURN(Json v, Eval(*n.exprs[c]));
            if (Truthy(v)) { taken = c; break; }
          }
          if (taken == n.bodies.size() && n.bodies.size() > n.exprs.size()) taken = n.exprs.size();  // else
          if (taken < n.bodies.size()) {
            TESSERA_ASSIGN_OR_RETURN(Flow f, Exec(n.bodies[taken]));
            if (f != kNormal) return f;
          }
          break;
        }
        case Node::kFor: TESSERA_RETURN_IF_ERROR(For(n)); break;
        case Node::kSet: {
          TESSERA_ASSIGN_OR_RETURN(Json v, Eval(*n.exprs[0]));
          if (n.attr.empty()) {
            scopes_.back()[n.text] = std::move(v);
          } else {
            Json* ns = Find(n.text);
            if (!ns || !ns->is_object()) return Error(n.line, absl::StrCat("cannot set ", n.text, ".", n.attr, ": ", n.text, " is not a namespace"));
            (*ns)[n.attr] = std::move(v);
          }
          break;
        }
        case Node::kBreak: return kBreak;
        case Node::kContinue: return kContinue;
      }
    }
    return kNormal;
  }

 private:
  Json* Find(const std::string& name) {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      auto it = s->find(name);
      if (it != s->end()) return &it->second;
    }
    return nullptr;
  }

  absl::Status For(const Node& n) {
    TESSERA_ASSIGN_OR_RETURN(Json seq, Eval(*n.exprs[0]));
    std::vector<Json> items;
    if (seq.is_array()) items.assign(seq.begin(), seq.end());
    else if (seq.is_object()) for (const auto& [k, v] : seq.items()) items.emplace_back(k);
    else if (seq.is_string()) for (char32_t c : DecodeUtf8(seq.get<std::string>())) { std::string s; AppendUtf8(c, &s); items.emplace_back(s); }
    else if (!IsUndefined(seq) && !seq.is_null()) return Error(n.line, absl::StrCat("cannot loop over ", PyRepr(seq)));
    scopes_.emplace_back();
    auto bind = [&](const Json& item) -> absl::Status {
      auto& scope = scopes_.back();
      if (n.vars.size() == 1) {
        scope[n.vars[0]] = item;
        return absl::OkStatus();
      }
      if (!item.is_array() || item.size() != n.vars.size())
        return Error(n.line, absl::StrCat("cannot unpack ", PyRepr(item), " into ", n.vars.size(), " names"));
      for (size_t v = 0; v < n.vars.size(); ++v) scope[n.vars[v]] = item[v];
      return absl::OkStatus();
    };
    if (n.exprs.size() > 1) {  // the loop's filter, evaluated with the item bound
      std::vector<Json> kept;
      for (auto& item : items) {
        absl::Status s = bind(item);
        auto keep = s.ok() ? Eval(*n.exprs[1]) : absl::StatusOr<Json>(s);
        if (!keep.ok()) { scopes_.pop_back(); return keep.status(); }
        if (Truthy(*keep)) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      scopes_.pop_back();
      if (n.bodies.size() > 1) TESSERA_RETURN_IF_ERROR(Exec(n.bodies[1]).status());
      return absl::OkStatus();
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      if (absl::Status s = bind(items[i]); !s.ok()) { scopes_.pop_back(); return s; }
      scopes_.back()["loop"] = Json{{"index", i + 1}, {"index0", i}, {"revindex", len - i}, {"revindex0", len - i - 1},
                           {"first", i == 0}, {"last", i == len - 1}, {"length", len},
                           {"previtem", i > 0 ? items[i - 1] : Undefined()}, {"nextitem", i + 1 < len ? items[i + 1] : Undefined()}};
      auto f = Exec(n.bodies[0]);
      if (!f.ok()) { scopes_.pop_back(); return f.status(); }
      if (*f == kBreak) break;
    }
    scopes_.pop_back();
    return absl::OkStatus();
  }

  absl::StatusOr<Json> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral: return e.value;
      case Expr::kName: {
        const Json* v = Find(e.name);
        return v ? *v : Undefined();
      }
      case Expr::kList: {
        Json a = Json::array();
        for (const auto& x : e.args) { TESSERA_ASSIGN_OR_RETURN(Json v, Eval(*x)); a.push_back(std::move(v)); }
        return a;
      }
      case Expr::kDict: {
        Json o = Json::object();
        for (size_t i = 0; i < e.args.size(); i += 2) {
          TESSERA_ASSIGN_OR_RETURN(Json k, Eval(*e.args[i]));
          TESSERA_ASSIGN_OR_RETURN(Json v, Eval(*e.args[i + 1]));
          o[ToString(k)] = std::move(v);
        }
        return o;
      }
      case Expr::kAttr: {
        TESSERA_ASSIGN_OR_RETURN(Json o, Eval(*e.args[0]));
        if (IsUndefined(o)) return Error(e.line, absl::StrCat("'", e.name, "' of an undefined value"));
        if (o.is_object() && o.contains(e.name)) return o[e.name];
        return Undefined();
      }
      case Expr::kIndex: {
        TESSERA_ASSIGN_OR_RETURN(Json o, Eval(*e.args[0]));
        TESSERA_ASSIGN_OR_RETURN(Json k, Eval(*e.args[1]));
        return Index(o, k, e.line);
      }
      case Expr::kSlice: return Slice(e);
      case Expr::kCall: return Call(e);
      case Expr::kFilter: return Filter(e);
      case Expr::kTest: {
        TESSERA_ASSIGN_OR_RETURN(bool r, Test(e));
        return e.value.get<bool>() ? !r : r;
      }
      case Expr::kNot: {
        TESSERA_ASSIGN_OR_RETURN(Json v, Eval(*e.args[0]));
        return !Truthy(v);
      }
      case Expr::kNeg: {
        TESSERA_ASSIGN_OR_RETURN(Json v, Eval(*e.args[0]));
        if (v.is_number_float()) return -v.get<double>();
        if (v.is_number()) {
          if (v.get<int64_t>() == INT64_MIN) return Error(e.line, "integer arithmetic past 64 bits");
          return -v.get<int64_t>();
        }
        return Error(e.line, absl::StrCat("cannot negate ", PyRepr(v)));
      }
      case Expr::kCond: {
        TESSERA_ASSIGN_OR_RETURN(Json c, Eval(*e.args[1]));
        return Eval(*e.args[Truthy(c) ? 0 : 2]);
      }
      case Expr::kBinary: return Binary(e);
    }
    return Undefined();
  }

  absl::StatusOr<Json> Index(const Json& o, const Json& k, int line) {
    if (IsUndefined(o)) return Error(line, absl::StrCat("[", PyRepr(k), "] of an undefined value"));
    if (o.is_object()) {
      const std::string key = k.is_string() ? k.get<std::string>() : PyRepr(k);
      return o.contains(key) ? o[key] : Undefined();
    }
    if ((o.is_array() || o.is_string()) && k.is_number_integer()) {
      std::vector<char32_t> cps;
      if (o.is_string()) cps = DecodeUtf8(o.get<std::string>());
      const int64_t n = o.is_array() ? static_cast<int64_t>(o.size()) : static_cast<int64_t>(cps.size());
      int64_t i = k.get<int64_t>();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Undefined();
      if (o.is_array()) return o[i];
      std::string s;
      AppendUtf8(cps[i], &s);
      return s;
    }
    return Undefined();
  }

  absl::StatusOr<Json> Slice(const Expr& e) {
    TESSERA_ASSIGN_OR_RETURN(Json o, Eval(*e.args[0]));
    int64_t b[3];
    bool given[3];
    for (int i = 0; i < 3; ++i) {
      given[i] = e.args[i + 1] != nullptr;
      if (!given[i]) continue;
      TESSERA_ASSIGN_OR_RETURN(Json v, Eval(*e.args[i + 1]));
      if (!v.is_number_integer()) return Error(e.line, "slice bounds must be integers");
      b[i] = v.get<int64_t>();
    }
    std::vector<Json> items;
    const bool str = o.is_string();
    if (str) for (char32_t c : DecodeUtf8(o.get<std::string>())) { std::string s; AppendUtf8(c, &s); items.emplace_back(s); }
    else if (o.is_array()) items.assign(o.begin(), o.end());
    else return Error(e.line, absl::StrCat("cannot slice ", PyRepr(o)));
    const int64_t n = static_cast<int64_t>(items.size());
    const int64_t step = given[2] ? b[2] : 1;
    if (step == 0) return Error(e.line, "slice step cannot be zero");
    auto clamp = [&](int64_t v, bool is_given, int64_t dflt) {
      if (!is_given) return dflt;
      if (v < 0) v += n;
      return step > 0 ? std::clamp<int64_t>(v, 0, n) : std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(b[0], given[0], step > 0 ? 0 : n - 1), stop = clamp(b[1], given[1], step > 0 ? n : -1);
    Json out = str ? Json("") : Json::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (str) out = out.get<std::string>() + items[i].get<std::string>();
      else out.push_back(items[i]);
    }
    return out;
  }

  absl::StatusOr<Json> Binary(const Expr& e) {
    const std::string& op = e.name;
    TESSERA_ASSIGN_OR_RETURN(Json a, Eval(*e.args[0]));
    if (op == "and") return Truthy(a) ? Eval(*e.args[1]) : a;
    if (op == "or") return Truthy(a) ? a : Eval(*e.args[1]);
    TESSERA_ASSIGN_OR_RETURN(Json b, Eval(*e.args[1]));
    if (op == "~") return ToString(a) + ToString(b);
    if (op == "==" || op == "!=") {
      const bool eq = (IsUndefined(a) && IsUndefined(b)) || (!IsUndefined(a) && !IsUndefined(b) && a == b);
      return op == "==" ? eq : !eq;
    }
    if (op == "in" || op == "not in") {
      bool in = false;
      if (b.is_string() && a.is_string()) in = b.get<std::string>().find(a.get<std::string>()) != std::string::npos;
      else if (b.is_array()) in = std::find(b.begin(), b.end(), a) != b.end();
      else if (b.is_object() && a.is_string()) in = b.contains(a.get<std::string>());
      else return Error(e.line, absl::StrCat("'in' needs a string, list or mapping on its right, not ", PyRepr(b)));
      return op == "in" ? in : !in;
    }
    const bool nums = a.is_number() && b.is_number();
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      if (nums) {
        const double x = a.get<double>(), y = b.get<double>();
        c = x < y ? -1 : x > y ? 1 : 0;
      } else if (a.is_string() && b.is_string()) {
        c = a.get<std::string>().compare(b.get<std::string>());
      } else {
        return Error(e.line, absl::StrCat("cannot compare ", PyRepr(a), " and ", PyRepr(b)));
      }
      return op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return a.get<std::string>() + b.get<std::string>();
      if (a.is_array() && b.is_array()) { Json r = a; for (const auto& x : b) r.push_back(x); return r; }
    }
    if (op == "*" && a.is_string() && b.is_number_integer()) {
      std::string r;
      if (b.get<int64_t>() > 0 && a.get_ref<const std::string&>().size() * static_cast<uint64_t>(b.get<int64_t>()) > kMaxString)
        return Error(e.line, "a repeated string longer than 16 MiB");
      for (int64_t i = 0; i < b.get<int64_t>(); ++i) r += a.get<std::string>();
      return r;
    }
    if (!nums) return Error(e.line, absl::StrCat("cannot apply '", op, "' to ", IsUndefined(a) ? "an undefined value" : PyRepr(a), " and ",
                                                 IsUndefined(b) ? "an undefined value" : PyRepr(b)));
    const bool ints = a.is_number_integer() && b.is_number_integer();
    if (op == "**") {
      if (ints && b.get<int64_t>() >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < b.get<int64_t>(); ++i)
          if (__builtin_mul_overflow(r, a.get<int64_t>(), &r)) return Error(e.line, "integer arithmetic past 64 bits");
        return r;
      }
      return std::pow(a.get<double>(), b.get<double>());
    }
    if (ints && op != "/") {
      const int64_t x = a.get<int64_t>(), y = b.get<int64_t>();
      int64_t z = 0;
      const bool over = op == "+" ? __builtin_add_overflow(x, y, &z) : op == "-" ? __builtin_sub_overflow(x, y, &z)
                      : op == "*" ? __builtin_mul_overflow(x, y, &z) : (x == INT64_MIN && y == -1);
      if (over) return Error(e.line, "integer arithmetic past 64 bits");
      if (op == "+" || op == "-" || op == "*") return z;
      if (y == 0) return Error(e.line, "division by zero");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) --q, r += y;  // Python floors
      return op == "//" ? q : r;
    }
    const double x = a.get<double>(), y = b.get<double>();
    if (op == "+") return x + y;
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (y == 0) return Error(e.line, "division by zero");
    if (op == "/") return x / y;
    if (op == "//") return std::floor(x / y);
    return x - y * std::floor(x / y);
  }

  absl::StatusOr<std::vector<Json>> Args(const Expr& e, size_t from) {
    std::vector<Json> out;
    for (size_t i = from; i < e.args.size(); ++i) { TESSERA_ASSIGN_OR_RETURN(Json v, Eval(*e.args[i])); out.push_back(std::move(v)); }
    return out;
  }
  absl::StatusOr<Json> Kwarg(const Expr& e, const std::string& name, Json dflt) {
    for (const auto& [k, v] : e.kwargs) if (k == name) return Eval(*v);
    return dflt;
  }

  absl::StatusOr<Json> Call(const Expr& e) {
    const Expr& callee = *e.args[0];
    TESSERA_ASSIGN_OR_RETURN(std::vector<Json> args, Args(e, 1));
    auto arg = [&](size_t i) { return i < args.size() ? args[i] : Undefined(); };
    if (callee.kind == Expr::kName && !Find(callee.name)) {
      if (callee.name == "raise_exception") return Error(e.line, absl::StrCat("raise_exception: ", ToString(arg(0))));
      if (callee.name == "namespace") {
        Json ns = Json::object();
        for (const auto& [k, v] : e.kwargs) {
          TESSERA_ASSIGN_OR_RETURN(ns[k], Eval(*v));
        }
        return ns;
      }
      if (callee.name == "range") {
        int64_t a = 0, b = 0, s = 1;
        if (args.size() == 1) b = ToInt(args[0]);
        else if (args.size() >= 2) a = ToInt(args[0]), b = ToInt(args[1]), s = args.size() > 2 ? ToInt(args[2]) : 1;
        if (s == 0) return Error(e.line, "range() step cannot be zero");
        int64_t span = 0;
        if (__builtin_sub_overflow(b, a, &span) || span / s > 1000000)
          return Error(e.line, "range() of more than a million numbers");
        Json r = Json::array();
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s) r.push_back(i);
        return r;
      }
      if (callee.name == "strftime_now") {
        char buf[128];
        const time_t now = time(nullptr);
        tm t;
        gmtime_r(&now, &t);
        strftime(buf, sizeof(buf), ToString(arg(0)).c_str(), &t);
        return std::string(buf);
      }
      return Error(e.line, absl::StrCat("'", callee.name, "' is not a function here"));
    }
    if (callee.kind != Expr::kAttr) return Error(e.line, "only functions and methods can be called");
    TESSERA_ASSIGN_OR_RETURN(Json o, Eval(*callee.args[0]));
    const std::string& m = callee.name;
    if (o.is_string()) {
      const std::string s = o.get<std::string>();
      if (m == "strip" || m == "lstrip" || m == "rstrip") return StripChars(s, m != "rstrip", m != "lstrip", arg(0));
      if (m == "startswith" || m == "endswith") {
        const std::string x = ToString(arg(0));
        return m == "startswith" ? s.rfind(x, 0) == 0 : (s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0);
      }
      if (m == "upper" || m == "lower") return AsciiCase(s, m == "upper" ? 1 : -1);
      if (m == "title") return Title(s);
      if (m == "replace") return Replace(s, ToString(arg(0)), ToString(arg(1)));
      if (m == "split") return Split(s, arg(0));
    }
    if (o.is_object()) {
      if (m == "items") { Json r = Json::array(); for (const auto& [k, v] : o.items()) r.push_back(Json::array({k, v})); return r; }
      if (m == "keys") { Json r = Json::array(); for (const auto& [k, v] : o.items()) r.push_back(k); return r; }
      if (m == "values") { Json r = Json::array(); for (const auto& [k, v] : o.items()) r.push_back(v); return r; }
      if (m == "get") {
        const std::string k = ToString(arg(0));
        return o.contains(k) ? o[k] : (args.size() > 1 ? args[1] : Json(nullptr));
      }
    }
    return Error(e.line, absl::StrCat("no method '", m, "' on ", IsUndefined(o) ? "an undefined value" : PyRepr(o)));
  }

  static std::string Title(const std::string& s) {
    std::string r = s;
    bool start = true;
    for (char& c : r) {
      const bool alpha = isalpha(static_cast<unsigned char>(c));
      c = alpha ? static_cast<char>(start ? toupper(static_cast<unsigned char>(c)) : tolower(static_cast<unsigned char>(c))) : c;
      start = !alpha;
    }
    return r;
  }
  static std::string Replace(std::string s, const std::string& a, const std::string& b) {
    if (a.empty()) return s;
    for (size_t p = s.find(a); p != std::string::npos; p = s.find(a, p + b.size())) s.replace(p, a.size(), b);
    return s;
  }
  static Json Split(const std::string& s, const Json& sep) {
    Json r = Json::array();
    if (sep.is_string() && !sep.get<std::string>().empty()) {
      const std::string d = sep.get<std::string>();
      size_t a = 0;
      for (size_t p; (p = s.find(d, a)) != std::string::npos; a = p + d.size()) r.push_back(s.substr(a, p - a));
      r.push_back(s.substr(a));
      return r;
    }
    std::string cur;
    for (char32_t c : DecodeUtf8(s)) {
      if (PySpace(c)) { if (!cur.empty()) r.push_back(cur), cur.clear(); }
      else AppendUtf8(c, &cur);
    }
    if (!cur.empty()) r.push_back(cur);
    return r;
  }

  absl::StatusOr<Json> Filter(const Expr& e) {
    TESSERA_ASSIGN_OR_RETURN(Json v, Eval(*e.args[0]));
    TESSERA_ASSIGN_OR_RETURN(std::vector<Json> args, Args(e, 1));
    auto arg = [&](size_t i) { return i < args.size() ? args[i] : Undefined(); };
    const std::string& f = e.name;
    if (f == "default" || f == "d") {
      TESSERA_ASSIGN_OR_RETURN(Json boolean, Kwarg(e, "boolean", args.size() > 1 ? args[1] : Json(false)));
      return IsUndefined(v) || (Truthy(boolean) && !Truthy(v)) ? (args.empty() ? Json("") : args[0]) : v;
    }
    if (f == "tojson") {
      TESSERA_ASSIGN_OR_RETURN(Json indent, Kwarg(e, "indent", args.empty() ? Json(nullptr) : args[0]));
      if (IsUndefined(v)) return Error(e.line, "tojson of an undefined value");
      std::string out;
      Dumps(v, indent.is_number_integer() ? static_cast<int>(indent.get<int64_t>()) : -1, 0, &out);
      return out;
    }
    if (f == "string") return ToString(v);
    if (f == "length" || f == "count") {
      if (v.is_string()) return static_cast<int64_t>(CodePoints(v.get<std::string>()));
      if (v.is_array() || v.is_object()) return static_cast<int64_t>(v.size());
      return Error(e.line, absl::StrCat("length of ", IsUndefined(v) ? "an undefined value" : PyRepr(v)));
    }
    if (f == "list") {
      if (v.is_array()) return v;
      Json r = Json::array();
      for (char32_t c : DecodeUtf8(ToString(v))) { std::string ch; AppendUtf8(c, &ch); r.push_back(ch); }
      return r;
    }
    if (f == "items") {
      Json r = Json::array();
      if (v.is_object()) for (const auto& [k, x] : v.items()) r.push_back(Json::array({k, x}));
      return r;
    }
    if (f == "first" || f == "last") {
      if (!(v.is_array() || v.is_string())) return Error(e.line, absl::StrCat(f, " of ", PyRepr(v)));
      return Index(v, Json(f == "first" ? 0 : -1), e.line);
    }
    if (f == "reverse") {
      if (v.is_array()) { Json r = Json::array(); for (auto it = v.rbegin(); it != v.rend(); ++it) r.push_back(*it); return r; }
      auto cps = DecodeUtf8(ToString(v));
      std::string r;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) AppendUtf8(*it, &r);
      return r;
    }
    if (f == "join") {
      if (!v.is_array()) return Error(e.line, absl::StrCat("join of ", PyRepr(v)));
      TESSERA_ASSIGN_OR_RETURN(Json attr, Kwarg(e, "attribute", Undefined()));
      std::string r;
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) r += ToString(arg(0));
        r += ToString(IsUndefined(attr) ? v[i] : (v[i].is_object() && v[i].contains(ToString(attr)) ? v[i][ToString(attr)] : Undefined()));
      }
      return r;
    }
    if (f == "map") {
      TESSERA_ASSIGN_OR_RETURN(Json attr, Kwarg(e, "attribute", Undefined()));
      if (IsUndefined(attr) || !v.is_array()) return Error(e.line, "only map(attribute=...) over a list is supported");
      Json r = Json::array();
      for (const auto& x : v) r.push_back(x.is_object() && x.contains(ToString(attr)) ? x[ToString(attr)] : Undefined());
      return r;
    }
    if (f == "selectattr" || f == "rejectattr") {
      if (!v.is_array()) return Error(e.line, absl::StrCat(f, " of ", PyRepr(v)));
      Json r = Json::array();
      for (const auto& x : v) {
        const Json a = x.is_object() && x.contains(ToString(arg(0))) ? x[ToString(arg(0))] : Undefined();
        bool ok = Truthy(a);
        if (args.size() >= 2) {
          const std::string test = ToString(args[1]);
          if (test == "equalto" || test == "eq" || test == "==") ok = !IsUndefined(a) && a == arg(2);
          else if (test == "defined") ok = !IsUndefined(a);
          else if (test == "undefined") ok = IsUndefined(a);
          else if (test == "none") ok = a.is_null();
          else return Error(e.line, absl::StrCat(f, " with the test '", test, "' is not supported"));
        }
        if (ok == (f == "selectattr")) r.push_back(x);
      }
      return r;
    }
    if (f == "int") return v.is_number() ? Json(ToInt(v)) : Json(std::strtoll(ToString(v).c_str(), nullptr, 10));
    if (f == "float") return v.is_number() ? Json(v.get<double>()) : Json(std::strtod(ToString(v).c_str(), nullptr));
    if (f == "abs" && v.is_number()) {
      if (v.is_number_float()) return std::fabs(v.get<double>());
      if (v.get<int64_t>() == INT64_MIN) return Error(e.line, "integer arithmetic past 64 bits");
      return std::llabs(v.get<int64_t>());
    }
    const std::string s = ToString(v);
    if (f == "trim") return StripChars(s, true, true, arg(0));
    if (f == "upper" || f == "lower") return AsciiCase(s, f == "upper" ? 1 : -1);
    if (f == "capitalize") return s.empty() ? s : AsciiCase(s.substr(0, 1), 1) + AsciiCase(s.substr(1), -1);
    if (f == "title") return Title(s);
    if (f == "replace") return Replace(s, ToString(arg(0)), ToString(arg(1)));
    return Error(e.line, absl::StrCat("the filter '", f, "' is not supported"));
  }

  absl::StatusOr<bool> Test(const Expr& e) {
    TESSERA_ASSIGN_OR_RETURN(Json v, Eval(*e.args[0]));
    TESSERA_ASSIGN_OR_RETURN(std::vector<Json> args, Args(e, 1));
    const std::string& t = e.name;
    if (t == "defined") return !IsUndefined(v);
    if (t == "undefined") return IsUndefined(v);
    if (t == "none") return v.is_null();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is_number_integer();
    if (t == "float") return v.is_number_float();
    if (t == "boolean") return v.is_boolean();
    if (t == "true") return v.is_boolean() && v.get<bool>();
    if (t == "false") return v.is_boolean() && !v.get<bool>();
    if (t == "mapping") return v.is_object();
    if (t == "sequence" || t == "iterable") return v.is_array() || v.is_string() || (t == "iterable" && v.is_object());
    if (t == "equalto" || t == "eq" || t == "sameas") return !args.empty() && !IsUndefined(v) && v == args[0];
    if (t == "odd" || t == "even") {
      if (!v.is_number_integer()) return Error(e.line, absl::StrCat("'", t, "' needs an integer"));
      return (v.get<int64_t>() % 2 != 0) == (t == "odd");
    }
    return Error(e.line, absl::StrCat("the test '", t, "' is not supported"));
  }

  std::vector<std::map<std::string, Json>> scopes_;
  std::string out_;
};

}  // namespace
}  // namespace jinja

absl::StatusOr<std::string> JinjaTemplate::Render(const nlohmann::ordered_json& vars) const {
  using namespace jinja;
  if (!vars.is_object()) return absl::InvalidArgumentError("template variables: expected an object");
  Renderer r(vars);
  TESSERA_RETURN_IF_ERROR(r.Exec(*root_).status());
  return std::move(r.out());
}

}  // namespace tessera::tokenizer
