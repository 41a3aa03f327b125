#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan/UBSan, coverage from every module) in build/fuzz and runs
# each on a copy of its checked-in seed corpus (fuzz/corpus/<target>) for SECONDS_PER_TARGET seconds
# (default 20), as many targets at a time as there are cores. A crash, sanitizer report, uncaught
# exception or InternalError fails the script and leaves the reproducer in <build>/crashes/<target>/.
# FUZZ_BUILD_DIR names an already configured clang tree with WEFT_BUILD_FUZZERS=ON and
# WEFT_SANITIZE=ON (CI reuses its ASan test tree): it is built, not reconfigured.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${SECONDS_PER_TARGET:-20}
targets=(graph_json cluster_json plan_json schedule_json trace_json program_json spec value_file program_verify)
build=${FUZZ_BUILD_DIR:-build/fuzz}
[ -n "${FUZZ_BUILD_DIR:-}" ] || cmake -S . -B build/fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-O1" -DCMAKE_CXX_FLAGS_DEBUG="-gline-tables-only" -DWEFT_BUILD_FUZZERS=ON -DWEFT_SANITIZE=ON -DWEFT_BUILD_TESTS=OFF \
  -DWEFT_BUILD_BENCHMARKS=OFF -DWEFT_ENABLE_NCCL=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
fuzz_one() {  # target -> its summary lines; exit 1 when it left a reproducer
  local t=$1 work=$build/corpus/$1 crashes=$build/crashes/$1
  rm -rf "$work" && mkdir -p "$work" "$crashes"
  cp fuzz/corpus/$t/* "$work/"
  local out
  out=$(ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$build/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -max_len=262144 \
    -print_final_stats=1 -artifact_prefix="$crashes/" "$work" 2>&1 |
    grep -E "^(stat::number_of_executed_units|#[0-9]+ +DONE|==[0-9]+==|SUMMARY|.*(ERROR|deadly|crash))" || true)
  printf 'fuzz_%s: %ss\n%s\n' "$t" "$secs" "$out"
  if compgen -G "$crashes/*" >/dev/null; then
    echo "fuzz_$t: crash reproducers in $crashes:" && ls "$crashes" && return 1
  fi
}
export -f fuzz_one
export build secs
printf '%s\n' "${targets[@]}" | xargs -P "$(nproc)" -I{} bash -c 'fuzz_one {}' || { echo "fuzzing: crashes found"; exit 1; }
echo "fuzzing: 0 crashes"
