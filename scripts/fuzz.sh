#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for SECONDS each (default 60), starting from the
# committed corpus (fuzz/corpus/TARGET) and writing what it discovers to a scratch corpus
# (fuzz/corpus-work/TARGET, ignored by git), so the committed corpus stays small.
#
# Needs a nightly toolchain and cargo-fuzz; without them it says so and exits 0, since the
# corpus and every regression also replay on stable in `cargo test --test it fuzz_replay`.
# A crash leaves its input in fuzz/artifacts/TARGET/ and makes the script exit 1: copy the
# input to fuzz/regressions/TARGET/, fix the bug, and the replay test keeps it fixed.
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -u
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "fuzz: skipped (no nightly toolchain; rustup toolchain install nightly)"
    exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    if ! cargo install cargo-fuzz --locked >/dev/null 2>&1; then
        echo "fuzz: skipped (cargo-fuzz is not installed and could not be installed)"
        exit 0
    fi
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(check mir mir_resealed safetensors npy exec)
fi

cd fuzz
cargo +nightly fuzz build >/dev/null 2>&1 || cargo +nightly fuzz build || exit 1
failed=0
for target in "${targets[@]}"; do
    mkdir -p "corpus-work/$target"
    options=(-max_total_time="$seconds" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1)
    if [ "$target" = check ]; then
        options+=(-dict=msl.dict -max_len=65536)
    fi
    log="corpus-work/$target.log"
    if cargo +nightly fuzz run "$target" "corpus-work/$target" "corpus/$target" -- "${options[@]}" >"$log" 2>&1; then
        status=ok
    else
        status=CRASH
        failed=1
    fi
    # The last status line libFuzzer printed: executions, coverage (cov) and features (ft).
    line=$(grep -E '^#[0-9]+' "$log" | tail -1)
    execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    rate=$(grep -E '^stat::average_exec_per_sec' "$log" | awk '{print $2}')
    echo "fuzz: $target: $status, ${execs:-?} execs, ${rate:-?} execs/s, last: ${line:-none}"
    if [ $status = CRASH ]; then
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -5 | sed 's/^/    /'
    fi
done
exit $failed
