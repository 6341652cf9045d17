#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/) for a bounded time and prints, per target, the
# executions, the corpus it grew and its findings (crashes, leaks, timeouts, out-of-memory).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]   SECONDS per target (default 30), all targets by default
#   scripts/fuzz.sh --ci                    the CI variant: 60 s per target
#
# Stable Rust only: cargo-fuzz (pinned, scripts/install-cargo-fuzz.sh) with `--sanitizer none`
# passes only stable codegen flags (SanitizerCoverage through -Cpasses/-Cllvm-args); libFuzzer
# itself is built from source by libfuzzer-sys with the system C++ compiler. Builds are release
# with debug assertions, so arithmetic overflow is a finding. A single allocation over 2 GiB is
# a finding too (libFuzzer's malloc limit), which is how "refused before allocating" is fuzzed.
#
# The corpus grows in fuzz/corpus/<target>/ (not committed), seeded from fuzz/seeds/<target>/;
# a finding is saved in fuzz/artifacts/<target>/ and reproduced with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none -O -a <target> <file>   (from fuzz/)
# Exits 1 when any target had a finding.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=30
if [ "${1:-}" = --ci ]; then
  seconds=60
  shift
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi

PATH="$(scripts/install-cargo-fuzz.sh):$PATH"
export PATH
# Lets cargo-fuzz treat stable as nightly; with `--sanitizer none` the RUSTFLAGS it passes are
# all stable (-Cpasses=sancov-module, -Cllvm-args=..., --cfg fuzzing), no -Z flag.
export RUSTC_BOOTSTRAP=1
flags=(--sanitizer none -O -a)

cd fuzz
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi
echo "fuzz: building ${#targets[@]} targets (cargo-fuzz $(cargo fuzz --version | cut -d' ' -f2))"
cargo fuzz build "${flags[@]}" >/dev/null
echo "fuzz: built after ${SECONDS}s"

# Inputs larger than the seeds are rarely more interesting; the bundle manifest seed is ~22 KiB,
# and a request to the metrics endpoint must reach past its 8 KiB head limit.
max_len() {
  case $1 in
    bundle_manifest) echo 32768 ;;
    metrics_request) echo 16384 ;;
    *) echo 8192 ;;
  esac
}

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# Targets run side by side, one per CPU (a libFuzzer process uses one): CI's 8 minutes of fuzzing
# take 4 on its 2 cores. PODCTL_FUZZ_JOBS sets how many at once.
parallel=${PODCTL_FUZZ_JOBS:-$(nproc)}
fuzz_one() {
  local t=$1 status=0
  cargo fuzz run "${flags[@]}" "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=2048 \
    -max_len="$(max_len "$t")" -print_final_stats=1 >"$logs/$t.log" 2>&1 || status=$?
  echo "$status" >"$logs/$t.status"
}
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t" "seeds/$t"
  find "artifacts/$t" -type f | sort >"$logs/$t.before"
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do
    wait -n || true
  done
  echo "fuzz: $t for ${seconds}s"
  fuzz_one "$t" &
done
wait

total_findings=0
results=()
for t in "${targets[@]}"; do
  status=$(cat "$logs/$t.status")
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$t.log" | awk '{print $2}' | tail -n1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$logs/$t.log" | awk '{print $2}' | tail -n1)
  corpus=$(find "corpus/$t" -type f | wc -l)
  find "artifacts/$t" -type f | sort | comm -13 "$logs/$t.before" - >"$logs/$t.new"
  findings=$(wc -l <"$logs/$t.new")
  if [ "$status" -ne 0 ] && [ "$findings" -eq 0 ]; then
    findings=1 # libFuzzer stopped without writing an artifact (e.g. the target failed to start)
  fi
  if [ "$findings" -gt 0 ]; then
    echo "fuzz: $t: FINDING (exit $status); the end of its log:"
    grep -v '^#\|^INFO\|^\s*$' "$logs/$t.log" | tail -n 40 | sed 's/^/  /'
    sed 's/^/  artifact: fuzz\//' "$logs/$t.new"
  fi
  total_findings=$((total_findings + findings))
  results+=("$(printf '%-22s %6ss %12s %10s %8s %9s' "$t" "$seconds" "${execs:-?}" "${rate:-?}" "$corpus" "$findings")")
done

printf '\n%-22s %7s %12s %10s %8s %9s\n' target time executions exec/s corpus findings
printf '%s\n' "${results[@]}"
if [ "$total_findings" -gt 0 ]; then
  echo "fuzz: $total_findings finding(s); see fuzz/artifacts/"
  exit 1
fi
echo "fuzz: no findings"
