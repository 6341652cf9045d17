#!/usr/bin/env bash
# Issue 2's TPU line: export a qwen3-1.7b bundle for mesh (fsdp=4, tp=2), compile its grad step
# for v6e:2x4 through libtpu twice, the same module (the bundle's programs/grad_step.mlirbc) with
# podctl's PJRT bindings (crates/pjrt's memory_stats example) and with JAX
# (lowered.compile().memory_analysis(), models/podctl_models/compiled_memory.py), print the
# per-device bytes side by side, and exit 1 when any of them differ. Each compile takes about
# 3 minutes on this machine.
#
#   scripts/bench/tpu-memory.sh [--out DIR] [--program NAME] [-- EXPORTER FLAGS...]
#
# Exporter flags after `--` replace the defaults below (micro-batch 8, 2048 tokens, remat dots,
# bfloat16 compute): e.g. `-- --micro-batch 16 --seq-len 1024 --remat full`.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=/tmp/podctl-tpu-memory
program=grad_step
topology=v6e:2x4
export_flags=(--micro-batch 8 --seq-len 2048 --remat dots --compute-dtype bfloat16)
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --program) program="$2"; shift 2 ;;
        --) shift; export_flags=("$@"); break ;;
        *) echo "unknown argument $1; usage: $0 [--out DIR] [--program NAME] [-- EXPORTER FLAGS...]" >&2
           exit 2 ;;
    esac
done

python=.venv/bin/python
libtpu=${PODCTL_LIBTPU:-.venv/lib/python3/site-packages/libtpu/libtpu.so}
for need in "$python" "$libtpu"; do
    [[ -e "$need" ]] || { echo "$need is missing; run scripts/setup.sh first" >&2; exit 2; }
done
mkdir -p "$out"
out=$(realpath "$out")

echo "== export qwen3-1.7b, mesh fsdp=4,tp=2, platform tpu: ${export_flags[*]}"
rm -rf "$out/bundle"
"$python" -m podctl_models.export --preset qwen3-1.7b --mesh fsdp=4,tp=2 --platform tpu \
    "${export_flags[@]}" --out "$out/bundle"

echo "== JAX: the bundle's $program module, lowered.compile().memory_analysis() for $topology"
"$python" -m podctl_models.compiled_memory "$out/bundle" --program "$program" --topology "$topology" \
    | tail -n 1 > "$out/jax.json"
devices=$("$python" -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["device_assignment"])))' \
    "$out/jax.json")

echo "== Rust: pjrt::Topology::compile through libtpu, partitions on JAX's devices $devices"
cargo build --release --quiet -p podctl-pjrt --example memory_stats
partitions=$(tr ',' '\n' <<<"$devices" | wc -l)
target/release/examples/memory_stats --plugin "$libtpu" --topology "$topology" \
    --partitions "$partitions" --devices "$devices" "$out/bundle/programs/$program.mlirbc" | tee "$out/rust.txt"

"$python" - "$out/jax.json" "$out/rust.txt" "$program" <<'EOF'
import json, sys

jax = json.load(open(sys.argv[1]))
rust = {}
for line in open(sys.argv[2]):
    name, _, value = line.rpartition(" ")
    if name.strip().endswith("bytes"):
        rust[name.strip().removesuffix(" bytes")] = int(value)
rows = [("argument", "argument"), ("output", "output"), ("alias", "alias"), ("temp", "temp"),
        ("generated code", "code"), ("peak", "peak")]
print(f"\nqwen3-1.7b {sys.argv[3]} on v6e:2x4 (fsdp=4, tp=2), bytes per device")
print(f"{'':<16}{'Rust (PJRT C API)':>20}{'JAX memory_analysis':>22}  equal")
differ = []
for label, key in rows:
    ours, theirs = rust[key], jax["generated_code" if key == "code" else key]
    print(f"{label:<16}{ours:>20,}{theirs:>22,}  {'yes' if ours == theirs else 'NO'}")
    if ours != theirs:
        differ.append(label)
print(f"JAX compile {jax['compile_s']} s")
if differ:
    print(f"DIFFERENT: {', '.join(differ)}")
    sys.exit(1)
print("all equal")
EOF
