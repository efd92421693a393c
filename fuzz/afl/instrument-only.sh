#!/usr/bin/env bash
# RUSTC_WRAPPER for the AFL++ build (scripts/fuzz.sh): coverage instrumentation only for
# the crates whose name matches $GYRE_AFL_INSTRUMENT (an extended regex), the others
# compiled as usual. AFL++'s allowlist (AFL_LLVM_ALLOWLIST) does the same for C; cargo-afl
# has none and puts its sanitizer-coverage flags on every crate.
#
# Why: AFL++ clears and scans the whole coverage map on every input. A target whose
# binary holds all of DataFusion (the stage-plan decoder: its function registry reaches
# every function) has 4.8 million counters and runs at about a thousand inputs a second;
# counting only the decoding crates' edges guides the fuzzer by the code under test and
# leaves the rest to run (a panic or a hang anywhere is still caught).
#
#   usage (by cargo): instrument-only.sh RUSTC ARGS...
set -euo pipefail
rustc=$1
shift
crate=""
prev=""
for a in "$@"; do
  if [ "$prev" = "--crate-name" ]; then
    crate=$a
    break
  fi
  prev=$a
done
pattern=${GYRE_AFL_INSTRUMENT:-^gyre_}
if [ -z "$crate" ] || [[ "$crate" =~ $pattern ]]; then
  exec "$rustc" "$@"
fi
# Drop the sanitizer-coverage pass and its options (each a `-C` followed by its value),
# and the single codegen unit cargo-afl asks for only to link that pass's output.
args=()
n=$#
i=1
while [ $i -le $n ]; do
  a=${!i}
  if [ "$a" = "-C" ] && [ $i -lt $n ]; then
    j=$((i + 1))
    v=${!j}
    case "$v" in
      passes=sancov*|llvm-args=-sanitizer-coverage*|codegen-units=1)
        i=$((i + 2))
        continue
        ;;
    esac
  fi
  case "$a" in
    -Cpasses=sancov*|-Cllvm-args=-sanitizer-coverage*|-Ccodegen-units=1)
      i=$((i + 1))
      continue
      ;;
  esac
  args+=("$a")
  i=$((i + 1))
done
exec "$rustc" "${args[@]}"
