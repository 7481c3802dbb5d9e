// The part of Jinja2 that Hugging Face chat templates use, rendered the way
// transformers' apply_chat_template renders them (trim_blocks, lstrip_blocks, the
// loopcontrols extension, raise_exception, a tojson that keeps non-ASCII). Chat
// templates are data from a model directory: this is an interpreter of that subset,
// not a general template engine, and it runs no user code.
//
// Supported: text; {{ expr }}; {% if / elif / else / endif %}; {% for a[, b] in expr %}
// ... {% else %} ... {% endfor %} with loop.index / index0 / revindex / revindex0 / first
// / last / length; {% set x = expr %} and {% set ns.x = expr %} (with namespace(...));
// {% break %} / {% continue %}; {% generation %} (ignored); comments; whitespace control
// ({%- -%} {{- -}} {%+). Expressions: literals (strings, numbers, true/false/none, lists,
// dicts), names, .attr, [index], [a:b:c], calls, filters (trim, length/count, upper,
// lower, capitalize, title, tojson, string, join, map(attribute=), first, last,
// default/d, replace, int, float, list, items, reverse, select/rejectattr), tests
// (defined, undefined, none, string, number, integer, mapping, sequence, iterable,
// boolean, true, false, equalto/eq, odd, even), `not`, `and`, `or`, `in`, `not in`,
// comparisons, + - * / // % ~, `x if c else y`; string methods strip / lstrip / rstrip /
// startswith / endswith / split / upper / lower / replace / title; dict items / keys /
// values / get; globals raise_exception, namespace, range, strftime_now.
// Anything else is refused when the template is parsed, naming the line.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace tessera::tokenizer {

class JinjaTemplate {
 public:
  // INVALID_ARGUMENT "template line N: ..." for what it cannot parse.
  static absl::StatusOr<JinjaTemplate> Parse(std::string_view source);
  // `vars` is an object of the template's variables (ordered: tojson keeps key order).
  // raise_exception(msg) and errors of evaluation are INVALID_ARGUMENT with the line.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& vars) const;

  JinjaTemplate(JinjaTemplate&&) noexcept;
  JinjaTemplate& operator=(JinjaTemplate&&) noexcept;
  ~JinjaTemplate();
  struct Body;

 private:
  JinjaTemplate() = default;
  std::unique_ptr<Body> root_;
};

}  // namespace tessera::tokenizer
