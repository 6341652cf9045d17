"""Per-chip memory of GRPO's `grpo_grad_step` with chunked vs unchunked log-probs, exact.

    .venv/bin/python models/scripts/grpo_memory.py [--micro-batch 16] [--out DIR]

Exports two GRPO bundles of Qwen3-1.7B for a v6e-8 slice (mesh fsdp=4, tp=2; the seeds'
target: prompts up to 256 tokens, up to 2048 generated), one with `--logprob-chunk` time
chunks and one unchunked (`logprob_chunk = 0`, which holds `[micro_batch, seq, vocab]` float32
logits). It then compiles each bundle's own `grpo_grad_step` module for the `v6e:2x4` topology
through libtpu on this CPU-only machine (`jax.experimental.topologies`) and prints XLA's
per-chip argument/output/temp bytes, the HBM the call reserves (argument + output - alias +
temp) and XLA's peak of live buffers side by side, and the saving in both as a fraction of the
unchunked path's logits bytes per chip. Each compile takes minutes. The bundles stay in
`--out` (`chunked/`, `unchunked/`) for a compile through podctl's PJRT bindings.
"""

from __future__ import annotations


import podctl_models.tpu_aot_env  # noqa: F401,E402  (before JAX: TPU AOT environment)

import argparse
import json
import sys
import time
from pathlib import Path

from podctl_models.compiled_memory import compile_stats
from podctl_models.config import MeshConfig, TrainConfig, preset
from podctl_models.export import BundleConfig, write_bundle

MESH = MeshConfig((("fsdp", 4), ("tp", 2)))
HBM_LIMIT = 31.25 * 2**30  # what XLA lets one v6e program use
GIB = 2**30


def export(out: Path, micro_batch: int, prompt_len: int, max_new_tokens: int, chunk: int,
           remat: str, attention: str) -> None:
    train = TrainConfig.grpo(prompt_len, max_new_tokens, chunk, micro_batch=micro_batch,
                             param_dtype="float32", compute_dtype="bfloat16", remat=remat,
                             attention=attention)
    cfg = BundleConfig(preset("qwen3-1.7b"), train, mesh=MESH, platform="tpu")
    start = time.perf_counter()
    write_bundle(cfg, out)
    print(f"exported {out} in {time.perf_counter() - start:.0f} s", flush=True)


def compiled(bundle: Path, program: str, topology: str) -> dict:
    stats = compile_stats(bundle, program, topology)
    print(f"compiled {bundle.name}/{program} for {topology} in {stats['compile_s']:.0f} s",
          flush=True)
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batch", type=int, default=16,
                        help="rows per grpo_grad_step on the slice (e.g. 2 prompts x group 8)")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=2048)
    parser.add_argument("--logprob-chunk", type=int, default=256,
                        help="time steps per chunk on the chunked path")
    parser.add_argument("--remat", default="dots")
    parser.add_argument("--attention", default="xla", choices=("xla", "blockwise", "pallas"),
                        help="the layers' attention (pallas: the seed-000 plan's choice)")
    parser.add_argument("--topology", default="v6e:2x4")
    parser.add_argument("--out", type=Path, default=Path("/tmp/podctl-grpo-memory"))
    parser.add_argument("--also", nargs="*", default=[], choices=("rollout", "logprobs"),
                        help="also compile these programs of the chunked bundle and print them")
    args = parser.parse_args(argv)

    results, extra = {}, {}
    for name, chunk in (("chunked", args.logprob_chunk), ("unchunked", 0)):
        bundle = args.out / name
        export(bundle, args.micro_batch, args.prompt_len, args.max_new_tokens, chunk, args.remat,
               args.attention)
        results[name] = compiled(bundle, "grpo_grad_step", args.topology)
        for program in args.also if chunk else ():
            extra[program] = compiled(bundle, program, args.topology)

    model = preset("qwen3-1.7b")
    seq = args.prompt_len + args.max_new_tokens
    fsdp, tp = MESH.size("fsdp"), MESH.size("tp")
    # The unchunked path's float32 logits, one chip's shard: rows over fsdp, vocab over tp.
    logits = args.micro_batch // fsdp * seq * (model.vocab_size // tp) * 4
    chunk_logits = args.micro_batch // fsdp * args.logprob_chunk * (model.vocab_size // tp) * 4
    print(f"\nqwen3-1.7b grpo_grad_step on {args.topology} (fsdp={fsdp}, tp={tp}): micro-batch "
          f"{args.micro_batch}, seq {seq} = {args.prompt_len} prompt + {args.max_new_tokens} "
          f"generated, bf16 compute, f32 params, remat {args.remat}, attention {args.attention}")
    print(f"{'per chip':<12}{'chunked':>14}{'unchunked':>14}   (chunk {args.logprob_chunk} steps)")
    for key in ("argument", "output", "alias", "temp", "reserved", "peak"):
        row = "".join(f"{results[n][key] / GIB:>10.2f} GiB" for n in ("chunked", "unchunked"))
        print(f"{key:<12}{row}")
    print("(reserved = argument + output - alias + temp; peak = XLA's peak of live buffers)")
    print(f"f32 logits per chip: unchunked {logits / GIB:.2f} GiB, one chunk "
          f"{chunk_logits / GIB:.3f} GiB")
    savings = {}
    for key in ("reserved", "peak"):
        saving = results["unchunked"][key] - results["chunked"][key]
        savings[key] = saving
        print(f"saving in {key}: {saving / GIB:.2f} GiB = {saving / logits:.2f} x the unchunked "
              f"logits (goal >= 0.5)")
    print(f"HBM limit {HBM_LIMIT / GIB:.2f} GiB per chip")
    for program, stats in extra.items():
        print(f"{program} (chunked bundle): " + ", ".join(
            f"{key} {stats[key] / GIB:.2f} GiB" for key in ("argument", "output", "temp", "peak")))
    print(json.dumps({"micro_batch": args.micro_batch, "seq_len": seq,
                      "logprob_chunk": args.logprob_chunk, "logits_bytes_per_chip": logits,
                      "saving_bytes": savings,
                      "saving_fraction_of_logits": {k: v / logits for k, v in savings.items()},
                      **results, **extra}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
