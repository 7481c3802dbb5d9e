#!/usr/bin/env bash
# bench/decode_phases.py on records with known stamps: a decode linear of 2 CTAs, then a
# paged attention of 2 CTAs that starts while it runs, then a launch missing a record
# (left out). Its medians, against the end of the kernel before, must be the stamps'.
#   decode_phases_test.sh SOURCE_DIR
set -uo pipefail
root=${1:?usage: decode_phases_test.sh SOURCE_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# id block grid t0..t7 (ns); 0: a point not passed.
cat > "$tmp/r.txt" <<'R'
111 0 2 0 500 1000 1200 0 0 0 3000
111 1 2 100 600 1100 1300 0 0 0 3200
164 0 2 2500 2800 3500 3700 4000 4200 0 5000
164 1 2 2600 2900 3400 3600 3900 4100 0 5200
211 0 2 5100 5300 5600 5800 0 0 0 6000
R
out=$(python3 "$root/bench/decode_phases.py" "$tmp/r.txt") || { echo "FAIL: decode_phases.py exited $?"; exit 1; }
echo "$out"
fail=0
want() { grep -qF -- "$1" <<< "$out" || { echo "FAIL: expected '$1'"; fail=1; }; }
want "2 complete launches of 5 records"
want "linear m1 ks1 norm g2 -> attention d64 g2  (1 launches)"
# start 2500 - 3200, waits 3400 / 3500 - 3200, end 5200 - 3200; the critical CTA (block 1):
# 300 before the wait, 500 in it, then 200, 300, 200 and 1100 to its end.
want "start -0.70  first wait 0.20  last wait 0.30  end 2.00  t1-t0 0.30  t2-t1 0.50  t3-t2 0.20  t4-t3 0.30  t5-t4 0.20  t7-t5 1.10"
echo "x" > "$tmp/bad.txt"
if python3 "$root/bench/decode_phases.py" "$tmp/bad.txt" 2> "$tmp/err"; then echo "FAIL: a malformed record was accepted"; fail=1; fi
grep -q "11 fields" "$tmp/err" || { echo "FAIL: the malformed record's error does not say what a record holds: $(cat "$tmp/err")"; fail=1; }
[ $fail -eq 0 ] && echo PASS
exit $fail
