#!/usr/bin/env bash
# Turns `go test -bench` output into one "name value unit" figure per line. A figure that has a
# row in bench/goals.tsv (benchmark, unit, comparator <=|<|>=|>, goal; '#' starts a comment) is
# printed with its goal and "met" or "missed" after it: "name value unit goal <= 2000 met".
set -euo pipefail
goals="${BENCH_GOALS:-$(dirname "$0")/../bench/goals.tsv}"
[ -f "$goals" ] || goals=/dev/null
awk -v goals="$goals" '
BEGIN {
  while ((getline line < goals) > 0) {
    if (line ~ /^[[:space:]]*(#|$)/) continue
    n = split(line, f, /[[:space:]]+/)
    if (n < 4) continue
    op[f[1] SUBSEP f[2]] = f[3]; want[f[1] SUBSEP f[2]] = f[4]
  }
}
/^Benchmark/ {
  name=$1; sub(/-[0-9]+$/, "", name)
  for (i = 3; i < NF; i += 2) {
    k = name SUBSEP $(i+1)
    if (!(k in op)) { print name, $i, $(i+1); continue }
    v = $i + 0; g = want[k] + 0; o = op[k]
    ok = (o == "<=" && v <= g) || (o == "<" && v < g) || (o == ">=" && v >= g) || (o == ">" && v > g)
    print name, $i, $(i+1), "goal", o, want[k], (ok ? "met" : "missed")
  }
}
/^(FAIL|panic)/ { print; failed=1 }
END { exit failed }'
