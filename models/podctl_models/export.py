"""Writes a bundle (docs/BUNDLE.md): its programs lowered with `jax.export` plus a manifest.

    python -m podctl_models.export --preset tiny --mesh fsdp=2,tp=2 --micro-batch 8 \
        --seq-len 128 --out DIR
    python -m podctl_models.export --kind grpo --preset tiny --micro-batch 8 --prompt-len 32 \
        --max-new-tokens 96 --logprob-chunk 32 --out DIR
    python -m podctl_models.export --model-json '{"preset": "hf:Qwen3-1.7B", "vocab_size": ...}' \
        --mesh fsdp=2,tp=2 --out DIR

The model is a preset (`presets.json`) or, with `--model-json`, the manifest's `model` object
itself: podctl passes the shape it read from a Hugging Face model's `config.json` that way.

Lowering needs shapes only: the mesh is a `jax.sharding.AbstractMesh`, so a TPU bundle for any
slice is written on a CPU-only machine. Exit status 2 means the settings cannot work (the message
names the field); nothing is written in that case.
"""

from __future__ import annotations

import os

# Lowering never needs an accelerator; without this, JAX would initialize libtpu when present.
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse
import contextlib
import dataclasses
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
from jax import export as jax_export
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

from . import __version__, attention, qwen3
from .config import (ConfigError, MeshConfig, ModelConfig, OptimizerConfig, TrainConfig,
                     check_mesh_fits, parse_mesh, preset)
from .programs import (OPTIONAL_PROGRAMS, Program, TensorSpec, build_programs, frozen_tensors,
                       program_names, trainable_specs)

FORMAT = "podctl-bundle/1"
PLATFORMS = ("cpu", "tpu")


@dataclass(frozen=True)
class BundleConfig:
    """Everything a bundle is lowered for."""

    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    platform: str = "cpu"
    # Programs beyond the kind's own (from OPTIONAL_PROGRAMS), e.g. "logits" for parity tests.
    optional: tuple[str, ...] = ()

    def validate(self) -> None:
        for name in self.optional:
            if name not in OPTIONAL_PROGRAMS:
                raise ConfigError(f"optional program {name!r} is unknown; the optional programs "
                                  f"are {', '.join(OPTIONAL_PROGRAMS)}")
        self.model.validate()
        self.train.validate()
        self.optimizer.validate()
        if self.platform not in PLATFORMS:
            raise ConfigError(
                f"platform = {self.platform!r}: choose one of {', '.join(PLATFORMS)}")
        if self.train.optimizer_offload and self.platform != "tpu":
            raise ConfigError(
                f"train.optimizer_offload on platform {self.platform!r}: host memory "
                f"(pinned_host) for AdamW state is a TPU memory kind; drop --offload-optimizer "
                f"or export for --platform tpu")
        check_mesh_fits(self.model, self.train, self.mesh)


@dataclass(frozen=True)
class ExportedProgram:
    """A program's signature and the module JAX lowered for it."""

    program: Program
    exported: jax_export.Exported


@contextlib.contextmanager
def reproducible_locations():
    """Source locations without directories or caller frames, so the same settings give the same
    bytes (and bundle identity) from any checkout and any caller, CLI or test."""
    settings = {"jax_include_full_tracebacks_in_locations": False,
                "jax_hlo_source_file_canonicalization_regex": r".*/"}
    saved = {name: getattr(jax.config, name) for name in settings}
    try:
        for name, value in settings.items():
            jax.config.update(name, value)
        yield
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)


def abstract_mesh(mesh: MeshConfig) -> AbstractMesh:
    return AbstractMesh(mesh.sizes, mesh.names)


def _sharding(mesh: AbstractMesh, tensor: TensorSpec) -> NamedSharding:
    return NamedSharding(mesh, P(*tensor.spec), memory_kind=tensor.memory_kind)


def lower(program: Program, mesh: AbstractMesh, platform: str) -> jax_export.Exported:
    """Lowers one program for `platform` over `mesh`, donating its `donated` inputs."""
    in_shardings = tuple(_sharding(mesh, t) for t in program.inputs)
    out_shardings = tuple(_sharding(mesh, t) for t in program.outputs)
    jitted = jax.jit(program.fn, in_shardings=in_shardings, out_shardings=out_shardings,
                     donate_argnums=tuple(sorted(program.donated)))
    args = [jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=s)
            for t, s in zip(program.inputs, in_shardings)]
    return jax_export.export(jitted, platforms=[platform])(*args)


def check_kept_args(name: str, exported: jax_export.Exported, inputs: tuple[TensorSpec, ...]):
    """Refuses a module from which JAX dropped unused arguments: the manifest would lie."""
    kept = tuple(exported.module_kept_var_idx)
    if kept != tuple(range(len(inputs))):
        dropped = [inputs[i].name for i in range(len(inputs)) if i not in kept]
        raise ConfigError(
            f"program {name}: JAX dropped unused inputs {dropped}; every input must be used "
            f"(remove it from the program's signature or use it)")


_MAIN_SIGNATURE = re.compile(r"func\.func public @main\((.*?)\)\s*->", re.S)
_ARG_START = re.compile(r"%arg(\d+):")


def aliased_inputs(exported: jax_export.Exported) -> set[int]:
    """Indices of the module's arguments that carry `tf.aliasing_output` (donated and reused)."""
    match = _MAIN_SIGNATURE.search(exported.mlir_module())
    if match is None:
        return set()
    signature = match.group(1)
    starts = list(_ARG_START.finditer(signature))
    aliased = set()
    for i, start in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(signature)
        if "tf.aliasing_output" in signature[start.end():end]:
            aliased.add(int(start.group(1)))
    return aliased


def check_donation(name: str, exported: jax_export.Exported, program: Program):
    """Refuses a module in which a donated input does not alias an output."""
    missing = sorted(program.donated - aliased_inputs(exported))
    if missing:
        names = [program.inputs[i].name for i in missing]
        raise ConfigError(
            f"program {name}: donated inputs {names} alias no output (no tf.aliasing_output); "
            f"each needs an output of the same shape, dtype and sharding")


def resolve(cfg: BundleConfig) -> BundleConfig:
    """`cfg` as lowered: Pallas attention on a CPU bundle becomes blockwise (with a note), and the
    manifest records what the programs actually do."""
    impl = attention.resolve(cfg.train.attention, cfg.platform)
    if impl == cfg.train.attention:
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, attention=impl))


def export_programs(cfg: BundleConfig) -> dict[str, ExportedProgram]:
    """Validates `cfg` and lowers its kind's programs; raises ConfigError on anything unusable."""
    cfg.validate()
    cfg = resolve(cfg)
    mesh = abstract_mesh(cfg.mesh)
    programs = build_programs(cfg.model, cfg.train, cfg.optimizer, mesh, cfg.optional)
    result = {}
    for name in program_names(cfg.train, cfg.optional):
        program = programs[name]
        with reproducible_locations():
            exported = lower(program, mesh, cfg.platform)
        check_kept_args(name, exported, program.inputs)
        check_donation(name, exported, program)
        result[name] = ExportedProgram(program, exported)
    return result


def manifest(cfg: BundleConfig, programs: dict[str, ExportedProgram]) -> dict:
    param_specs = trainable_specs(cfg.model, cfg.train, cfg.mesh.names)
    params = [TensorSpec(f"params/{s.path}", s.shape, cfg.train.param_dtype, s.spec).manifest()
              for s in param_specs]
    frozen = [t.manifest() for t in frozen_tensors(cfg.model, cfg.train)]
    entries = {}
    for name, item in programs.items():
        program = item.program
        entries[name] = {
            "file": f"programs/{name}.mlirbc",
            "jax_file": f"programs/{name}.jaxexport",
            "inputs": [t.manifest(donated=i in program.donated)
                       for i, t in enumerate(program.inputs)],
            "outputs": [t.manifest() for t in program.outputs],
        }
    document = {
        "format": FORMAT,
        "exporter": {"version": __version__, "jax": jax.__version__},
        "platform": cfg.platform,
        "mesh": cfg.mesh.to_json(),
        "model": cfg.model.to_json(),
        "train": cfg.train.to_json(),
        "optimizer": cfg.optimizer.to_json(),
        "params": params,
        "programs": entries,
    }
    if frozen:
        # LoRA: the frozen base, `init`'s first outputs and `grad_step`'s first inputs.
        document["frozen"] = frozen
    return document


def dumps_manifest(document: dict) -> str:
    """Indented JSON with one tensor per line: a 1.7B manifest stays readable."""
    tensors: list[str] = []

    def stash(value):
        if isinstance(value, dict) and "shape" in value and "sharding" in value:
            tensors.append(json.dumps(value))
            return f"@tensor{len(tensors) - 1}@"
        if isinstance(value, dict):
            return {k: stash(v) for k, v in value.items()}
        if isinstance(value, list):
            return [stash(v) for v in value]
        return value

    text = json.dumps(stash(document), indent=1)
    return re.sub(r'"@tensor(\d+)@"', lambda m: tensors[int(m.group(1))], text) + "\n"


def write_bundle(cfg: BundleConfig, out: Path) -> dict:
    """Exports and writes the bundle to `out`; the manifest is written last, atomically."""
    cfg.validate()
    cfg = resolve(cfg)
    programs = export_programs(cfg)
    (out / "programs").mkdir(parents=True, exist_ok=True)
    for name, item in programs.items():
        (out / "programs" / f"{name}.mlirbc").write_bytes(item.exported.mlir_module_serialized)
        (out / "programs" / f"{name}.jaxexport").write_bytes(item.exported.serialize())
    document = manifest(cfg, programs)
    tmp = out / "manifest.json.tmp"
    tmp.write_text(dumps_manifest(document))
    tmp.replace(out / "manifest.json")
    return document


def summary(cfg: BundleConfig, document: dict) -> str:
    sizes = dict(cfg.mesh.axes)
    lines = [f"{cfg.model.preset}: {qwen3.num_params(cfg.model):,} parameters, mesh "
             + ",".join(f"{n}={s}" for n, s in cfg.mesh.axes) + f", platform {cfg.platform}"]
    for name, entry in document["programs"].items():
        tensors = [TensorSpec(t["name"], tuple(t["shape"]), t["dtype"],
                              tuple(None if not a else a[0] if len(a) == 1 else tuple(a)
                                    for a in t["sharding"]))
                   for t in entry["inputs"]]
        total = sum(t.nbytes for t in tensors)
        per_device = sum(t.shard_bytes(sizes) for t in tensors)
        lines.append(f"  {name:<14} {len(tensors):>3} args, {total / 2**20:,.1f} MiB global, "
                     f"{per_device / 2**20:,.1f} MiB per device")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> tuple[BundleConfig, Path]:
    defaults_train, defaults_opt = TrainConfig(), OptimizerConfig()
    parser = argparse.ArgumentParser(prog="python -m podctl_models.export",
                                     description="Export a podctl bundle (docs/BUNDLE.md).")
    parser.add_argument("--preset", help="tiny | small | qwen3-0.6b | qwen3-1.7b")
    parser.add_argument("--model-json", help="the model's dimensions as the manifest's `model` "
                        "object (JSON), instead of --preset")
    parser.add_argument("--with-logits", action="store_true",
                        help="also export the `logits` program (full float32 logits; for tests)")
    parser.add_argument("--kind", default="sft", help="sft | grpo")
    parser.add_argument("--mesh", default="fsdp=1,tp=1", help="ICI mesh, e.g. fsdp=2,tp=2")
    parser.add_argument("--micro-batch", type=int, default=defaults_train.micro_batch)
    parser.add_argument("--seq-len", type=int, default=None,
                        help=f"sft: tokens per row (default {defaults_train.seq_len}); grpo: "
                             "derived, prompt-len + max-new-tokens")
    parser.add_argument("--remat", default=defaults_train.remat)
    parser.add_argument("--loss-chunk", type=int, default=None,
                        help="sft: time steps per loss chunk (default: min("
                             f"{defaults_train.loss_chunk}, seq-len)); grpo: from --logprob-chunk")
    parser.add_argument("--prompt-len", type=int, default=None,
                        help="grpo, or sft with held-out evaluation: tokens of the left-padded "
                             "prompt buffer of `rollout`")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="grpo, or sft with held-out evaluation: tokens of the completion "
                             "buffer of `rollout`")
    parser.add_argument("--logprob-chunk", type=int, default=None,
                        help="grpo: time steps per log-prob chunk, 0 = unchunked (default: "
                             "min(64, prompt-len + max-new-tokens))")
    parser.add_argument("--prompt-group", type=int, default=1,
                        help="grpo: consecutive rows of a micro-batch answering one prompt (the "
                             "job's generations), whose prompt is computed once (default 1)")
    parser.add_argument("--param-dtype", default=defaults_train.param_dtype)
    parser.add_argument("--compute-dtype", default=defaults_train.compute_dtype)
    parser.add_argument("--attention", default=defaults_train.attention,
                        help="xla | blockwise | pallas (TPU; blockwise on cpu)")
    parser.add_argument("--attention-block", type=int, default=defaults_train.attention_block,
                        help="keys per block of blockwise attention")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA rank; 0 = full tuning")
    parser.add_argument("--lora-alpha", type=float, default=defaults_train.lora_alpha)
    parser.add_argument("--lora-targets", default=",".join(defaults_train.lora_targets),
                        help="comma-separated projections, e.g. q_proj,v_proj")
    parser.add_argument("--lora-base-dtype", default=defaults_train.lora_base_dtype)
    parser.add_argument("--offload-optimizer", action="store_true",
                        help="keep AdamW state in host memory between steps (TPU only)")
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--b1", type=float, default=defaults_opt.b1)
    parser.add_argument("--b2", type=float, default=defaults_opt.b2)
    parser.add_argument("--eps", type=float, default=defaults_opt.eps)
    parser.add_argument("--weight-decay", type=float, default=defaults_opt.weight_decay)
    parser.add_argument("--max-grad-norm", type=float, default=defaults_opt.max_grad_norm)
    parser.add_argument("--out", required=True, type=Path, help="bundle directory to write")
    args = parser.parse_args(argv)
    common = dict(micro_batch=args.micro_batch, param_dtype=args.param_dtype,
                  compute_dtype=args.compute_dtype, remat=args.remat, attention=args.attention,
                  attention_block=args.attention_block, lora_rank=args.lora_rank,
                  lora_alpha=args.lora_alpha,
                  lora_targets=tuple(t.strip() for t in args.lora_targets.split(",") if t.strip()),
                  lora_base_dtype=args.lora_base_dtype,
                  optimizer_offload=args.offload_optimizer)
    if args.kind == "grpo":
        train = _grpo_train(args, common)
    else:
        if args.logprob_chunk is not None:
            raise ConfigError(f"train.logprob_chunk = {args.logprob_chunk!r}: only grpo bundles "
                              f"have it; add --kind grpo or drop --logprob-chunk")
        if args.prompt_group != 1:
            raise ConfigError(f"train.prompt_group = {args.prompt_group!r}: only grpo bundles "
                              f"have it; add --kind grpo or drop --prompt-group")
        # An sft bundle with both rollout buffers also gets `rollout`, for held-out evaluation.
        common.update(prompt_len=args.prompt_len or 0, max_new_tokens=args.max_new_tokens or 0)
        seq_len = defaults_train.seq_len if args.seq_len is None else args.seq_len
        loss_chunk = args.loss_chunk
        if loss_chunk is None:
            loss_chunk = min(defaults_train.loss_chunk, seq_len)
        train = TrainConfig(kind=args.kind, seq_len=seq_len, loss_chunk=loss_chunk, **common)
    opt = OptimizerConfig(b1=args.b1, b2=args.b2, eps=args.eps, weight_decay=args.weight_decay,
                          max_grad_norm=args.max_grad_norm)
    cfg = BundleConfig(_model(args), train, opt, parse_mesh(args.mesh), args.platform,
                       ("logits",) if args.with_logits else ())
    return cfg, args.out


def _model(args) -> ModelConfig:
    """The model of `--preset` or `--model-json` (exactly one of them)."""
    if (args.preset is None) == (args.model_json is None):
        raise ConfigError("model: give exactly one of --preset NAME or --model-json OBJECT")
    if args.preset is not None:
        return preset(args.preset)
    try:
        fields = json.loads(args.model_json)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--model-json is not JSON ({err}); pass the manifest's model "
                          f"object") from None
    if not isinstance(fields, dict):
        raise ConfigError("--model-json must be a JSON object (the manifest's model object)")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(fields) - known)
    missing = sorted(f.name for f in dataclasses.fields(ModelConfig)
                     if f.name not in fields and f.default is dataclasses.MISSING)
    if unknown or missing:
        raise ConfigError(f"--model-json: unknown fields {unknown}, missing fields {missing}; "
                          f"the fields are {', '.join(sorted(known))}")
    return ModelConfig(**fields)


def _grpo_train(args, common: dict) -> TrainConfig:
    """The GRPO train setting from the CLI: rollout shapes given, seq_len and loss_chunk derived
    (an explicit value that disagrees is refused, naming the field)."""
    for flag in ("prompt_len", "max_new_tokens"):
        if getattr(args, flag) is None:
            raise ConfigError(
                f"train.{flag} is missing: a grpo bundle needs --{flag.replace('_', '-')}")
    total = args.prompt_len + args.max_new_tokens
    chunk = args.logprob_chunk
    if chunk is None:
        chunk = min(64, total)
    train = TrainConfig.grpo(args.prompt_len, args.max_new_tokens, chunk,
                             prompt_group=args.prompt_group, **common)
    if args.seq_len is not None:
        train = dataclasses.replace(train, seq_len=args.seq_len)
    if args.loss_chunk is not None:
        train = dataclasses.replace(train, loss_chunk=args.loss_chunk)
    return train


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    try:
        cfg, out = parse_args(argv)
        document = write_bundle(cfg, out)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary(cfg, document))
    print(f"wrote {out} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
