"""Does a sequence axis in the mesh pay? Exact per-chip memory of Qwen3-1.7B SFT on a v6e-8.

    .venv/bin/python models/scripts/sequence_axis.py [--jobs 1] [--out DIR]

A sequence axis `sp` splits every activation's time dimension over its devices (keys and values
are gathered whole for attention) and the parameters over `fsdp` and `sp` together, so it
shards the train state like FSDP and the activations like more rows per device would. At a
fixed number of chips it can only pay where rows run out: one row per chip is as far as `fsdp`
goes, and `sp` then splits that row. This script compiles, through libtpu for `v6e:2x4` on
this CPU-only machine, each configuration's own `grad_step` and `apply_step` modules and prints
the step's HBM per chip (the larger of `grad_step` reserved plus the AdamW moments it does not
take, and `apply_step` reserved):

- 2048 tokens, xla attention, remat dots, 16 rows: (fsdp 8) against (fsdp 4, sp 2) and
  (fsdp 4, tp 2) at the same tokens per chip ((fsdp 4, tp 2) is also what
  crates/planner/examples/levers.rs compiles for `xla`);
- 32768 tokens, blockwise attention, remat full: one row per chip (fsdp 8, 8 rows) against
  half a row per chip split by time (fsdp 4, sp 2, 4 rows) or by heads (fsdp 4, tp 2, 4 rows).

Minutes per compile; bundles are left in --out.
"""

from __future__ import annotations


import podctl_models.tpu_aot_env  # noqa: F401,E402  (before JAX: TPU AOT environment)

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

GIB = 2**30
HBM_LIMIT = 31.25 * GIB

# (name, mesh, micro-batch, seq, attention, remat)
CONFIGS = (
    ("2k fsdp8", "fsdp=8", 16, 2048, "xla", "dots"),
    ("2k fsdp4 sp2", "fsdp=4,sp=2", 16, 2048, "xla", "dots"),
    ("2k fsdp4 tp2", "fsdp=4,tp=2", 16, 2048, "xla", "dots"),
    ("32k fsdp8 (1 row/chip)", "fsdp=8", 8, 32768, "blockwise", "full"),
    ("32k fsdp4 sp2 (row/2)", "fsdp=4,sp=2", 4, 32768, "blockwise", "full"),
    ("32k fsdp4 tp2 (row/2)", "fsdp=4,tp=2", 4, 32768, "blockwise", "full"),
)


def measure(job: tuple) -> tuple[str, dict]:
    from podctl_models.compiled_memory import compile_stats
    from podctl_models.config import TrainConfig, parse_mesh, preset
    from podctl_models.export import BundleConfig, write_bundle

    (name, mesh, micro_batch, seq, attention, remat), out = job
    bundle = Path(out) / name.split(" (")[0].replace(" ", "-")
    train = TrainConfig(micro_batch=micro_batch, seq_len=seq, loss_chunk=256, remat=remat,
                        param_dtype="float32", compute_dtype="bfloat16", attention=attention,
                        attention_block=512)
    cfg = BundleConfig(preset("qwen3-1.7b"), train, mesh=parse_mesh(mesh), platform="tpu")
    if not (bundle / "manifest.json").exists():
        write_bundle(cfg, bundle)
    document = json.loads((bundle / "manifest.json").read_text())
    result = {"moments": 2 * per_chip(document, document["params"])}
    for program in ("grad_step", "apply_step"):
        stats = compile_stats(bundle, program)
        print(f"compiled {name} {program} in {stats['compile_s']:.0f} s", flush=True)
        result[program] = stats
    return name, result


def per_chip(document: dict, tensors: list) -> int:
    sizes = {axis["name"]: axis["size"] for axis in document["mesh"]}
    itemsize = {"float32": 4, "bfloat16": 2}
    total = 0
    for t in tensors:
        n = itemsize[t["dtype"]]
        for dim, axes in zip(t["shape"], t["sharding"]):
            split = 1
            for axis in axes:
                split *= sizes[axis]
            n *= dim // split
        total += n
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="compiles at once")
    parser.add_argument("--only", default="", help="comma-separated config names")
    parser.add_argument("--out", type=Path, default=Path("/tmp/podctl-sequence-axis"))
    args = parser.parse_args(argv)
    configs = [c for c in CONFIGS if not args.only or c[0] in args.only.split(",")]
    start = time.perf_counter()
    pool = multiprocessing.get_context("spawn").Pool(args.jobs)
    results = {}
    # Each result as it arrives (a stopped run keeps what it measured), the table at the end.
    for name, result in pool.imap_unordered(measure, [(c, str(args.out)) for c in configs]):
        results[name] = result
        print(json.dumps({name: result}), flush=True)
    pool.close()
    pool.join()
    print(f"\nall compiles in {time.perf_counter() - start:.0f} s\n")
    print("qwen3-1.7b SFT on v6e:2x4, bf16 compute, f32 params and AdamW state, loss chunk 256; "
          "GiB per chip")
    print(f"{'configuration':<26}{'tokens/fsdp':>12}{'grad temp':>11}{'grad reserved':>15}"
          f"{'apply reserved':>16}{'step HBM':>10}  fits")
    for name, mesh, micro_batch, seq, _, _ in configs:
        r = results[name]
        sizes = dict(part.split("=") for part in mesh.split(","))
        chips_per_row = int(sizes.get("sp", 1)) * int(sizes.get("tp", 1))
        tokens = micro_batch * seq // int(sizes.get("fsdp", 1))
        step = max(r["grad_step"]["reserved"] + r["moments"], r["apply_step"]["reserved"])
        print(f"{name:<26}{tokens:>12}{r['grad_step']['temp'] / GIB:>11.2f}"
              f"{r['grad_step']['reserved'] / GIB:>15.2f}{r['apply_step']['reserved'] / GIB:>16.2f}"
              f"{step / GIB:>10.2f}  {'yes' if step <= HBM_LIMIT else 'NO'}"
              f"   ({chips_per_row} chip(s) per row slice)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
