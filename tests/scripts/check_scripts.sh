#!/usr/bin/env bash
# The scripts that only run on GPU hosts (scripts/gpu-*.sh) or by hand cannot run
# here, and a syntax error in one costs a whole GPU run: every shell script under
# scripts/, bench/ and deploy/ must parse (bash -n), and so must every Python program —
# bench/*.py, scripts/*.py, examples/servers/*.py and each Python heredoc (<<'PY' ... PY) inside the shell scripts.
#   check_scripts.sh SOURCE_DIR
set -uo pipefail
root=${1:?usage: check_scripts.sh SOURCE_DIR}
cd "$root" || exit 2
command -v python3 > /dev/null || { echo "FAIL: python3 not found (scripts/setup.sh installs it)"; exit 1; }
TMPDIR_CHECK=$(mktemp -d); export TMPDIR_CHECK
trap 'rm -rf "$TMPDIR_CHECK"' EXIT
bad=0; shells=0; pythons=0
while IFS= read -r f; do
  shells=$((shells + 1))
  bash -n "$f" || { echo "FAIL: $f does not parse (bash -n)"; bad=1; }
  # Each heredoc body between a line ending in <<'PY' and the line PY.
  awk -v f="$f" '
    /<<.?PY.?[[:space:]]*$/ { inside = 1; n++; out = sprintf("%s/heredoc.%d.py", ENVIRON["TMPDIR_CHECK"], n); printf "" > out; print out; next }
    inside && /^PY$/ { inside = 0; next }
    inside { print >> out }' "$f" > "$TMPDIR_CHECK/list" 2>/dev/null
  while IFS= read -r py; do
    pythons=$((pythons + 1))
    python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read())' "$py" 2> "$TMPDIR_CHECK/err" \
      || { echo "FAIL: a Python heredoc in $f does not parse: $(tail -1 "$TMPDIR_CHECK/err")"; bad=1; }
    rm -f "$py"
  done < "$TMPDIR_CHECK/list"
done < <(find scripts bench deploy tests/scripts -name '*.sh' -type f | sort)
for f in bench/*.py scripts/*.py examples/servers/*.py; do
  [ -f "$f" ] || continue
  pythons=$((pythons + 1))
  python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read())' "$f" 2> "$TMPDIR_CHECK/err" \
    || { echo "FAIL: $f does not parse: $(tail -1 "$TMPDIR_CHECK/err")"; bad=1; }
done
echo "check_scripts: $shells shell scripts, $pythons Python programs"
exit $bad
