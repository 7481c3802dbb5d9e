// Internal to jinja.cc / jinja_parse.cc: the parsed template's tree.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/tokenizer/jinja.h"

namespace tessera::tokenizer::jinja {

using Json = nlohmann::ordered_json;

inline Json Undefined() { return Json(Json::value_t::discarded); }
inline bool IsUndefined(const Json& v) { return v.is_discarded(); }
inline absl::Status Error(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("template line ", line, ": ", what));
}

struct Expr {
  enum Kind { kLiteral, kName, kList, kDict, kAttr, kIndex, kSlice, kCall, kFilter, kTest, kNot, kNeg, kBinary, kCond } kind;
  int line = 0;
  Json value;       // literal
  std::string name;  // name, attribute, filter, test, operator
  std::vector<std::unique_ptr<Expr>> args;  // operands / arguments (nullptr: an omitted slice bound)
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet, kBreak, kContinue } kind;
  Node(Kind k, int l, std::string t = {});  // defined below, once Body is complete
  int line = 0;
  std::string text;                   // text; set: the name
  std::string attr;                   // set ns.attr
  std::vector<std::string> vars;      // for
  std::vector<ExprPtr> exprs;         // output: [e]; if: conditions; for: [iterable]; set: [value]
  std::vector<JinjaTemplate::Body> bodies;  // if: one per condition (+ else); for: body (+ else)
};

}  // namespace tessera::tokenizer::jinja

namespace tessera::tokenizer {
struct JinjaTemplate::Body {
  std::vector<jinja::Node> nodes;
};
inline jinja::Node::Node(Kind k, int l, std::string t) : kind(k), line(l), text(std::move(t)) {}
}  // namespace tessera::tokenizer
