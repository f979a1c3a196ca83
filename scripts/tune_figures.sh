#!/usr/bin/env bash
# Default vs tuned end-to-end forward time per model, measured in one script on this machine:
# `mslc tune` (60 s budget each, one fresh knowledge base for the set), a second `mslc tune` of
# the same model (reusing the knowledge base: its wall-clock seconds are printed), `mslc build`
# with that knowledge base (writes the tuned kernel table, graph-level decisions included), then
# `mslc run` with the default kernels and with the tuned table, alternated three times, median
# of N forwards each (more for sub-millisecond models: a second's worth); the row shows the three
# medians of each (the spread) and the ratio of the lowest ones; the last line is the geometric
# mean; each row also shows the tune's own whole-model confirmation (default -> tuned forward
# and the decisions it kept), and the share of this machine's measured FMA peak the default
# forward's GFLOP/s reach (as `mslc run` reports it; a decode's small products are bound by
# memory, not by the peak). Usage: scripts/tune_figures.sh [BUDGET] [N]
set -euo pipefail
MSLC=${MSLC:-target/release/mslc}
BUDGET=${1:-60s}
N=${2:-20}
WORK=$(mktemp -d)
KB="$WORK/kb.json"
trap 'rm -rf "$WORK"' EXIT
# The median seconds per forward of `mslc run "$@"` over ITERS forwards, and the share of the
# measured peak its GFLOP/s are.
median_of() {
  local iters=$1; shift
  local out
  out=$("$MSLC" run "$@" --init-seed 1 --iterations "$iters" --message-format json 2>&1 || true)
  python3 -c 'import json,sys
for line in sys.argv[1].splitlines():
    d = json.loads(line) if line.startswith("{") else {}
    if "summary" in d:
        s = d["summary"]
        peak = (s.get("peak") or {}).get("gflops_per_s")
        print(s["median_ms"] / 1e3, s["gflops_per_s"] / peak if peak else "nan"); sys.exit()
sys.exit("run failed: " + sys.argv[1][:2000])' "$out"
}
# The median over N forwards, or over as many as fill a second for a sub-millisecond model
# (and its share of the peak).
median() {
  local m share
  read -r m share <<<"$(median_of "$N" "$@")"
  local more
  more=$(python3 -c "print(max($N, int(1.0 / max($m, 1e-6))))")
  if [ "$more" -gt "$N" ]; then read -r m share <<<"$(median_of "$more" "$@")"; fi
  echo "$m $share"
}
row() {
  local label=$1; shift
  "$MSLC" tune "$@" --budget "$BUDGET" --db "$KB" -o "$WORK/$label" >"$WORK/$label.tune.txt"
  local whole
  whole=$(python3 -c 'import json, sys
w = json.load(open(sys.argv[1]))["whole_model"]
if w is None:
    print("confirm: nothing changed")
else:
    d, t, k = w["default_ms"], w["tuned_ms"], w["kept"]
    print(f"confirm: {d:.3f}->{t:.3f} ms, kept {k}")' "$WORK/$label"/*.tune.json)
  local again
  again=$(python3 -c 'import subprocess, sys, time
t = time.monotonic()
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(time.monotonic() - t)' "$MSLC" tune "$@" --budget "$BUDGET" --db "$KB" -o "$WORK/$label.again")
  "$MSLC" build "$@" --tune-db "$KB" -o "$WORK/$label" >/dev/null
  local table
  table=$(ls "$WORK/$label"/*.kernels.toml)
  local d1 t1 d2 t2 d3 t3 s1 s2 s3 _
  read -r d1 s1 <<<"$(median "$@")"; read -r t1 _ <<<"$(median "$@" --kernels "$table")"
  read -r d2 s2 <<<"$(median "$@")"; read -r t2 _ <<<"$(median "$@" --kernels "$table")"
  read -r d3 s3 <<<"$(median "$@")"; read -r t3 _ <<<"$(median "$@" --kernels "$table")"
  local unfused
  unfused=$(grep -c '^fused = false' "$table" || true)
  python3 - "$label" "$d1" "$t1" "$d2" "$t2" "$d3" "$t3" "$again" "$unfused" "$whole" \
    "$s1" "$s2" "$s3" <<'PY' | tee -a "$WORK/rows"
import sys
label = sys.argv[1]
d1, t1, d2, t2, d3, t3, again = map(float, sys.argv[2:9])
d, t = min(d1, d2, d3), min(t1, t2, t3)
# The share of the peak of the fastest default run.
share = float(sys.argv[11:14][[d1, d2, d3].index(d)])
ms = lambda *xs: "/".join(f"{x*1e3:.3f}" for x in xs)
print(f"{label:<16} default {ms(d1, d2, d3)} ms ({100 * share:.0f} % of the FMA peak)"
      f"  tuned {ms(t1, t2, t3)} ms  speed-up {d/t:5.3f}x  ({sys.argv[9]} subgraphs unfused;"
      f" re-tune {again:.2f} s; {sys.argv[10]})")
PY
}
row tiny_llama_S128 examples/tiny_llama.msl
row tiny_llama_S1 examples/tiny_llama.msl --dim S=1
row mlp examples/mlp.msl
row bert_base_2l_B1 examples/bert_base.msl --set layers=2 --dim B=1
row resnet50_B1_64 examples/resnet50.msl --dim B=1 --dim R=64
python3 - "$WORK/rows" <<'PY'
import math, re, sys
ratios = [float(m.group(1)) for m in map(re.compile(r"speed-up +([0-9.]+)x").search, open(sys.argv[1])) if m]
print(f"geometric mean speed-up {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}x over {len(ratios)} models")
PY
