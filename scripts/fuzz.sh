#!/usr/bin/env bash
# Coverage-guided fuzzing of Gyre's decoders with AFL++ (cargo-afl): the targets of
# crates/fuzz (frames stream flow control ipc cyclo plan redo), one binary each from
# fuzz/afl, in AFL's persistent mode. Installs cargo-afl (which builds AFL++) when
# missing. Fails if AFL++ saved a crash or a hang, and prints how to replay each.
#
#   scripts/fuzz.sh [--execs N | --seconds S] [TARGET ...]   default: all, 10M inputs each
#   scripts/fuzz.sh --smoke              CI: frames, stream and flow for 45 s each
#
# The instrumented build of the DataFusion-based targets takes about 30 minutes on
# two cores; --smoke builds without them (cargo feature `engine` off). Findings and the
# corpus stay in $GYRE_FUZZ_DIR (default ~/.cache/gyre/fuzz/TARGET).
set -euo pipefail
cd "$(dirname "$0")/.."

execs=10000000
seconds=""
features=()
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --execs) execs=$2; shift 2 ;;
    --seconds) seconds=$2; execs=""; shift 2 ;;
    --smoke) seconds=45; execs=""; features=(--no-default-features); shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done

export CARGO_TERM_COLOR=never
tools="${GYRE_AFL_TOOLS:-$HOME/.cache/gyre/cargo-afl}"
export PATH="$tools/bin:$PATH"
if ! cargo afl --version >/dev/null 2>&1; then
  echo "== installing cargo-afl into $tools"
  CARGO_TARGET_DIR="$tools/build" cargo install --quiet --locked cargo-afl --version 0.18.2 --root "$tools"
  rm -rf "$tools/build"
fi
# AFL++ itself (afl-fuzz and its runtime), built once per toolchain from cargo-afl's copy
# of its sources with make and a C compiler.
if ! ls "${XDG_DATA_HOME:-$HOME/.local/share}"/afl.rs/rustc-*/afl.rs-0.18.2/afl/bin/afl-fuzz >/dev/null 2>&1; then
  echo "== building AFL++"
  if ! command -v make >/dev/null || ! command -v cc >/dev/null; then
    apt-get update -qq && apt-get install -y -qq build-essential >/dev/null
  fi
  cargo afl config --build
fi

if [ ${#targets[@]} -eq 0 ]; then
  targets=(frames stream flow)
  [ ${#features[@]} -eq 0 ] && targets+=(control ipc cyclo plan redo)
fi
bins=()
for t in "${targets[@]}"; do
  case "$t" in
    frames|stream|flow|control|ipc|cyclo|plan|redo) bins+=(--bin "$t") ;;
    *) echo "fuzz.sh: no target $t (frames stream flow control ipc cyclo plan redo)" >&2; exit 2 ;;
  esac
done

echo "== instrumented build of ${targets[*]}"
export CARGO_TARGET_DIR="${GYRE_AFL_TARGET_DIR:-$HOME/.cache/gyre-afl-target}"
# Coverage counters only in Gyre's crates and the libraries its decoders run (protobuf
# plans, Arrow IPC, postcard): see fuzz/afl/instrument-only.sh. Other crates still run,
# so their panics and hangs are still found; they only do not guide the search.
export GYRE_AFL_INSTRUMENT="${GYRE_AFL_INSTRUMENT:-^(gyre_.*|datafusion_proto.*|datafusion_physical_(plan|expr|expr_common)|datafusion_datasource.*|datafusion_common|datafusion_expr|datafusion_expr_common|arrow_(ipc|array|data|buffer|schema|select|row)|postcard|prost|lz4_flex|bytes)\$}"
export RUSTC_WRAPPER="$PWD/fuzz/afl/instrument-only.sh"
(cd fuzz/afl && cargo afl build --release "${features[@]}" "${bins[@]}")
bin="$CARGO_TARGET_DIR/release"

work="${GYRE_FUZZ_DIR:-$HOME/.cache/gyre/fuzz}"
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_QUIET=1 AFL_TRY_AFFINITY=1
failed=0
report=()
for t in "${targets[@]}"; do
  dir="$work/$t"
  rm -rf "$dir"
  "$bin/$t" seeds "$dir/in"
  limit=(-V "$seconds")
  [ -n "$execs" ] && limit=(-E "$execs")
  echo "== fuzzing $t (${execs:+$execs inputs}${seconds:+$seconds s})"
  # -t: an input that takes 2 s to decode is a hang and saved as one.
  cargo afl fuzz -i "$dir/in" -o "$dir/out" -t 2000 "${limit[@]}" -- "$bin/$t" \
    > "$dir/afl.log" 2>&1 || { tail -20 "$dir/afl.log"; echo "fuzz.sh: afl-fuzz failed on $t" >&2; exit 1; }
  stats="$dir/out/default/fuzzer_stats"
  get() { awk -F' *: *' -v k="$1" '$1 == k { print $2 }' "$stats"; }
  line=$(printf '%-8s %12s inputs  %8s/s  %6s s  corpus %5s  edges %s  crashes %s  hangs %s' \
    "$t" "$(get execs_done)" "$(get execs_per_sec)" "$(get run_time)" "$(get corpus_count)" \
    "$(get edges_found)" "$(get saved_crashes)" "$(get saved_hangs)")
  echo "$line"
  report+=("$line")
  for kind in crashes hangs; do
    for f in "$dir"/out/default/"$kind"/id:*; do
      [ -e "$f" ] || continue
      failed=1
      echo "fuzz.sh: $t: $kind input $f; replay: $bin/$t < '$f'" >&2
    done
  done
done
echo "== AFL++ summary ($(date -u +%F), $(nproc) cores)"
printf '%s\n' "${report[@]}"
exit $failed
