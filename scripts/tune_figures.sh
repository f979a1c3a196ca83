#!/usr/bin/env bash
# Default vs tuned end-to-end forward time per model, measured in one script on this machine:
# `mslc tune` (60 s budget each, a fresh knowledge base), `mslc build` with that knowledge base
# (writes the tuned kernel table), then `mslc run` with the default kernels and with the tuned
# table, alternated, median of N forwards each. Usage: scripts/tune_figures.sh [BUDGET] [N]
set -euo pipefail
MSLC=${MSLC:-target/release/mslc}
BUDGET=${1:-60s}
N=${2:-20}
WORK=$(mktemp -d)
KB="$WORK/kb.json"
trap 'rm -rf "$WORK"' EXIT
median() {
  local out
  out=$("$MSLC" run "$@" --init-seed 1 --iterations "$N" --message-format json 2>&1 || true)
  python3 -c 'import json,sys
for line in sys.argv[1].splitlines():
    d = json.loads(line) if line.startswith("{") else {}
    if "summary" in d:
        print(d["summary"]["median_ms"] / 1e3); sys.exit()
sys.exit("run failed: " + sys.argv[1][:2000])' "$out"
}
row() {
  local label=$1; shift
  "$MSLC" tune "$@" --budget "$BUDGET" --db "$KB" -o "$WORK/$label" >"$WORK/$label.tune.txt"
  "$MSLC" build "$@" --tune-db "$KB" -o "$WORK/$label" >/dev/null
  local table
  table=$(ls "$WORK/$label"/*.kernels.toml)
  local d1 t1 d2 t2
  d1=$(median "$@"); t1=$(median "$@" --kernels "$table")
  d2=$(median "$@"); t2=$(median "$@" --kernels "$table")
  python3 - "$label" "$d1" "$t1" "$d2" "$t2" <<'PY'
import sys
label, d1, t1, d2, t2 = sys.argv[1], *map(float, sys.argv[2:])
d, t = min(d1, d2), min(t1, t2)
print(f"{label:<22} default {d*1e3:9.3f} ms   tuned {t*1e3:9.3f} ms   speed-up {d/t:5.3f}x")
PY
}
row tiny_llama_S128 examples/tiny_llama.msl
row tiny_llama_S1 examples/tiny_llama.msl --dim S=1
row mlp examples/mlp.msl
row bert_base_2l_B1 examples/bert_base.msl --set layers=2 --dim B=1
row resnet50_B1_64 examples/resnet50.msl --dim B=1 --dim R=64
