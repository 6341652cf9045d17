"""Per-chip memory of Qwen3-1.7B SFT on a v6e-8 with each memory lever, exact.

    .venv/bin/python models/scripts/levers_memory.py [--micro-batch 16] [--seq-len 2048] \
        [--variants xla,blockwise,pallas,xla+lora,blockwise+lora] [--jobs 2] [--out DIR]

Exports one SFT bundle per variant (mesh fsdp=4, tp=2, bf16 compute, f32 trainable parameters
and AdamW state, remat dots): attention `xla` (plain, `[T, T]` scores), `blockwise` (online
softmax over key blocks, pure JAX) or `pallas` (the TPU flash-attention kernel), each with full
fine-tuning or `+lora` (rank 64 on every projection, frozen base in bf16). It compiles each
bundle's own `grad_step` module, and `apply_step` once per fine-tuning mode (it does not depend
on attention), for the `v6e:2x4` topology through libtpu on this CPU-only machine
(`jax.experimental.topologies`; `compiled_memory.compile_stats`), minutes per `grad_step`.

Per chip it prints XLA's argument / temp / reserved (argument + output - alias + temp) and peak of
`grad_step`, the train state the worker keeps resident between calls (frozen base + parameters +
AdamW moments + gradient buffers), and the step's HBM: the larger of `grad_step` reserved plus the
moments it does not take, and `apply_step` reserved plus the frozen base it does not take.
"""

from __future__ import annotations


import podctl_models.tpu_aot_env  # noqa: F401,E402  (before JAX: TPU AOT environment)

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

MESH = (("fsdp", 4), ("tp", 2))
HBM_LIMIT = 31.25 * 2**30  # what XLA lets one v6e program use
GIB = 2**30
VARIANTS = ("xla", "blockwise", "pallas", "xla+lora", "blockwise+lora", "pallas+lora")


def train_config(variant: str, args):
    from podctl_models.config import TrainConfig

    attention, _, lora = variant.partition("+")
    extra = dict(lora_rank=args.lora_rank, lora_alpha=float(2 * args.lora_rank)) if lora else {}
    return TrainConfig(micro_batch=args.micro_batch, seq_len=args.seq_len,
                       loss_chunk=args.loss_chunk, param_dtype="float32",
                       compute_dtype="bfloat16", remat=args.remat, attention=attention,
                       attention_block=args.attention_block, **extra)


def measure(job: tuple[str, tuple[str, ...], dict]) -> tuple[str, dict]:
    """Exports `variant`'s bundle and compiles `programs`; runs in a child process."""
    from podctl_models.compiled_memory import compile_stats
    from podctl_models.config import MeshConfig, preset
    from podctl_models.export import BundleConfig, write_bundle

    variant, programs, options = job
    args = argparse.Namespace(**options)
    bundle = Path(args.out) / variant.replace("+", "-")
    cfg = BundleConfig(preset("qwen3-1.7b"), train_config(variant, args), mesh=MeshConfig(MESH),
                       platform="tpu")
    write_bundle(cfg, bundle)
    document = json.loads((bundle / "manifest.json").read_text())
    result = {"bundle": str(bundle), "resident": resident_bytes(document)}
    for program in programs:
        stats = compile_stats(bundle, program, args.topology)
        print(f"compiled {variant}/{program} in {stats['compile_s']:.0f} s", flush=True)
        result[program] = stats
    return variant, result


def resident_bytes(document: dict) -> dict:
    """Per-chip bytes of each group of tensors the worker keeps between calls."""
    sizes = {axis["name"]: axis["size"] for axis in document["mesh"]}
    itemsize = {"float32": 4, "bfloat16": 2}

    def per_chip(tensors):
        total = 0
        for t in tensors:
            n = itemsize[t["dtype"]]
            for dim, axes in zip(t["shape"], t["sharding"]):
                n *= dim // (sizes[axes[0]] if axes else 1)
            total += n
        return total

    params = per_chip(document["params"])
    return {"frozen": per_chip(document.get("frozen", [])), "params": params,
            "moments": 2 * params, "grads": params}


def step_bytes(result: dict, apply: dict) -> int:
    """HBM of a whole step: grad_step with the moments beside it, apply_step with the base."""
    resident = result["resident"]
    return max(result["grad_step"]["reserved"] + resident["moments"],
               apply["reserved"] + resident["frozen"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batch", type=int, default=16, help="rows per grad_step")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--loss-chunk", type=int, default=256)
    parser.add_argument("--attention-block", type=int, default=512)
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--remat", default="dots")
    parser.add_argument("--variants", default="xla,blockwise,pallas,xla+lora,blockwise+lora")
    parser.add_argument("--topology", default="v6e:2x4")
    parser.add_argument("--jobs", type=int, default=2,
                        help="compiles at once (each a process, about 1.5 GB of RAM)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/podctl-levers-memory"))
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"--variants: {v!r} is unknown; choose from {', '.join(VARIANTS)}")
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    # apply_step depends only on what is trained: compile it with the first variant of each mode.
    jobs, seen = [], set()
    for v in variants:
        mode = "lora" if "+lora" in v else "full"
        programs = ("grad_step",) if mode in seen else ("grad_step", "apply_step")
        seen.add(mode)
        jobs.append((v, programs, options))
    start = time.perf_counter()
    pool = multiprocessing.get_context("spawn").Pool(args.jobs)
    results = dict(pool.imap_unordered(measure, jobs))
    pool.close()
    pool.join()
    print(f"\nall compiles in {time.perf_counter() - start:.0f} s")

    applies = {}
    for v in variants:
        if "apply_step" in results[v]:
            applies["lora" if "+lora" in v else "full"] = results[v]["apply_step"]
    print(f"\nqwen3-1.7b SFT grad_step on {args.topology} (fsdp=4, tp=2): micro-batch "
          f"{args.micro_batch}, seq {args.seq_len}, bf16 compute, f32 trainable params and AdamW "
          f"state, remat {args.remat}, loss chunk {args.loss_chunk}; LoRA rank {args.lora_rank} "
          f"on all 7 projections, bf16 base; GiB per chip")
    header = f"{'':<22}" + "".join(f"{v:>16}" for v in variants)
    print(header)
    rows = [
        ("grad_step argument", lambda r, a: r["grad_step"]["argument"]),
        ("grad_step temp", lambda r, a: r["grad_step"]["temp"]),
        ("grad_step reserved", lambda r, a: r["grad_step"]["reserved"]),
        ("grad_step peak", lambda r, a: r["grad_step"]["peak"]),
        ("apply_step reserved", lambda r, a: a["reserved"]),
        ("resident state", lambda r, a: sum(r["resident"].values())),
        ("step HBM", lambda r, a: step_bytes(r, a)),
    ]
    for label, value in rows:
        line = "".join(
            f"{value(results[v], applies['lora' if '+lora' in v else 'full']) / GIB:>16.2f}"
            for v in variants)
        print(f"{label:<22}{line}")
    print("(reserved = argument + output - alias + temp; peak = XLA's peak of live buffers; "
          "resident = frozen + params + moments + grads; step HBM = max(grad_step reserved + "
          f"moments, apply_step reserved + frozen)); HBM limit {HBM_LIMIT / GIB:.2f} GiB")
    print(json.dumps({"micro_batch": args.micro_batch, "seq_len": args.seq_len,
                      "lora_rank": args.lora_rank, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
