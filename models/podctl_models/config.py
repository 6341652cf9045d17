"""Model presets, train and optimizer settings, and the checks that tie them to a mesh.

Every field check raises `ConfigError` naming the field, the value and the fix, because the
exporter's CLI turns these messages straight into its exit-2 diagnostics.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from dataclasses import dataclass

# The names of the ICI mesh axes the model shards over; a bundle's mesh always has both, major
# first, so every sharding in the manifest names axes the mesh has.
MESH_AXES = ("fsdp", "tp")
# An optional sequence axis (a bundle has it only when asked for): activations split their time
# dimension over it, parameters are split over `fsdp` and `sp` together. SFT only, for measuring
# what it buys (models/scripts/sequence_axis.py); podctl does not run such bundles.
SEQUENCE_AXIS = "sp"

DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "dots", "full")
ATTENTION_IMPLS = ("xla", "blockwise", "pallas")
# The projections LoRA adapters may sit on (the layer matrices of `qwen3.param_specs`).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KINDS = ("sft", "grpo")


class ConfigError(ValueError):
    """A setting that cannot work; the message names the field, the value and the fix."""


@dataclass(frozen=True)
class ModelConfig:
    """A Qwen3-family decoder's architecture (the manifest's `model` object)."""

    preset: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True

    def validate(self) -> None:
        for field in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                      "head_dim", "intermediate_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model.{field} = {value!r}: must be a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_heads = {self.num_heads} is not a multiple of model.num_kv_heads = "
                f"{self.num_kv_heads}: grouped-query attention needs whole groups")
        if self.head_dim % 2:
            raise ConfigError(f"model.head_dim = {self.head_dim}: RoPE needs an even head_dim")
        for field in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"model.{field} = {value!r}: must be a positive number")
        if not isinstance(self.tie_embeddings, bool):
            raise ConfigError(f"model.tie_embeddings = {self.tie_embeddings!r}: must be true or "
                              f"false")
        if not isinstance(self.preset, str) or not self.preset:
            raise ConfigError(f"model.preset = {self.preset!r}: name the model (a string)")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _load_presets() -> dict[str, ModelConfig]:
    # presets.json is shared with the Rust side (crates/bundle), so both agree on every shape.
    raw = json.loads((Path(__file__).parent / "presets.json").read_text())
    return {name: ModelConfig(name, **dims) for name, dims in raw.items() if not name.startswith("_")}


PRESETS: dict[str, ModelConfig] = _load_presets()


def preset(name: str) -> ModelConfig:
    """The preset called `name`, or a `ConfigError` listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"preset = {name!r} is unknown; choose one of {', '.join(PRESETS)}") from None


@dataclass(frozen=True)
class TrainConfig:
    """How one micro-batch is computed (the manifest's `train` object).

    For `kind = "grpo"` a row is `prompt_len` prompt tokens (left-padded) followed by
    `max_new_tokens` completion tokens, so `seq_len` must be their sum and `loss_chunk` the
    time chunk of every log-prob computation (`logprob_chunk`, or `seq_len` when that is 0 =
    unchunked). `TrainConfig.grpo(...)` fills both in.
    """

    micro_batch: int = 8
    seq_len: int = 128
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat: str = "none"
    loss_chunk: int = 64
    attention: str = "xla"
    # Keys per block of `blockwise` attention (rounded down to a divisor of seq_len).
    attention_block: int = 512
    kind: str = "sft"
    # LoRA (0 = full fine-tuning): adapters of this rank on `lora_targets`, scaled by
    # `lora_alpha / lora_rank`; the base matrices are frozen, stored in `lora_base_dtype`.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = LORA_TARGETS
    lora_base_dtype: str = "bfloat16"
    # AdamW's moments in host memory (`pinned_host`) between steps; TPU bundles only.
    optimizer_offload: bool = False
    # GRPO only: the shapes of the rollout's buffers and the log-prob chunk (0 = unchunked,
    # which materializes `[micro_batch, seq_len, vocab]` logits; kept for comparisons).
    prompt_len: int = 0
    max_new_tokens: int = 0
    logprob_chunk: int = 0
    # GRPO only: consecutive rows of a micro-batch that answer the same prompt (the job's
    # `generations`). The gradient and log-prob programs then run each prompt once and its
    # completions against its keys and values; 1 runs every row whole.
    prompt_group: int = 1

    @classmethod
    def grpo(cls, prompt_len: int, max_new_tokens: int, logprob_chunk: int = 64,
             **rest) -> "TrainConfig":
        """A GRPO setting with `seq_len` and `loss_chunk` derived from the rollout shapes."""
        seq_len = prompt_len + max_new_tokens
        return cls(kind="grpo", prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                   logprob_chunk=logprob_chunk, seq_len=seq_len,
                   loss_chunk=logprob_chunk or seq_len, **rest)

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"train.kind = {self.kind!r}: choose one of {', '.join(KINDS)}")
        if self.kind == "grpo":
            self._validate_grpo()
        else:
            self._validate_sft_decoding()
        for field in ("micro_batch", "seq_len", "loss_chunk"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"train.{field} = {value!r}: must be a positive integer")
        for field in ("param_dtype", "compute_dtype"):
            value = getattr(self, field)
            if value not in DTYPES:
                raise ConfigError(f"train.{field} = {value!r}: choose one of {', '.join(DTYPES)}")
        if self.remat not in REMAT_POLICIES:
            raise ConfigError(
                f"train.remat = {self.remat!r}: choose one of {', '.join(REMAT_POLICIES)}")
        if self.attention not in ATTENTION_IMPLS:
            raise ConfigError(
                f"train.attention = {self.attention!r}: choose one of {', '.join(ATTENTION_IMPLS)}")
        if not isinstance(self.attention_block, int) or self.attention_block <= 0:
            raise ConfigError(f"train.attention_block = {self.attention_block!r}: must be a "
                              f"positive integer")
        if self.lora_rank:
            self._validate_lora()
        if self.seq_len % self.loss_chunk:
            raise ConfigError(
                f"train.loss_chunk = {self.loss_chunk} does not divide train.seq_len = "
                f"{self.seq_len}; pick a divisor of seq_len")

    def _validate_lora(self) -> None:
        if not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ConfigError(f"train.lora_rank = {self.lora_rank!r}: must be >= 0 (0 = off)")
        if self.kind != "sft":
            raise ConfigError(f"train.lora_rank = {self.lora_rank}: LoRA bundles are sft only "
                              f"for now; set train.kind = 'sft' or lora_rank = 0")
        if not self.lora_alpha > 0:
            raise ConfigError(f"train.lora_alpha = {self.lora_alpha!r}: must be > 0")
        if not self.lora_targets or len(set(self.lora_targets)) != len(self.lora_targets):
            raise ConfigError(f"train.lora_targets = {list(self.lora_targets)!r}: name each "
                              f"projection once, from {', '.join(LORA_TARGETS)}")
        for target in self.lora_targets:
            if target not in LORA_TARGETS:
                raise ConfigError(f"train.lora_targets: {target!r} is not a projection; choose "
                                  f"from {', '.join(LORA_TARGETS)}")
        if self.lora_base_dtype not in DTYPES:
            raise ConfigError(f"train.lora_base_dtype = {self.lora_base_dtype!r}: choose one of "
                              f"{', '.join(DTYPES)}")

    def _validate_sft_decoding(self) -> None:
        """An SFT bundle decodes only for held-out evaluation: both rollout buffers or neither."""
        if self.logprob_chunk:
            raise ConfigError(f"train.logprob_chunk = {self.logprob_chunk!r}: only grpo bundles "
                              f"have it; set train.kind = 'grpo' or leave it 0")
        if bool(self.prompt_len) != bool(self.max_new_tokens):
            raise ConfigError("train.prompt_len and train.max_new_tokens: an sft bundle's rollout "
                              "(held-out evaluation) needs both buffers, or neither")
        for field in ("prompt_len", "max_new_tokens"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"train.{field} = {value!r}: must be a positive integer")
        if self.prompt_len and self.lora_rank:
            raise ConfigError("train.prompt_len: held-out evaluation of a LoRA bundle is not "
                              "supported yet; drop the rollout buffers or lora_rank")

    @property
    def decodes(self) -> bool:
        """Whether the bundle has a `rollout` program (GRPO's sampling, SFT's evaluation)."""
        return self.prompt_len > 0

    def _validate_grpo(self) -> None:
        for field in ("prompt_len", "max_new_tokens"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"train.{field} = {value!r}: must be a positive integer")
        chunk = self.logprob_chunk
        if not isinstance(chunk, int) or chunk < 0:
            raise ConfigError(
                f"train.logprob_chunk = {chunk!r}: must be >= 0 (0 = unchunked)")
        total = self.prompt_len + self.max_new_tokens
        if self.seq_len != total:
            raise ConfigError(
                f"train.seq_len = {self.seq_len!r}: a grpo row is prompt_len + max_new_tokens = "
                f"{total} tokens; leave seq_len out (it is derived)")
        if chunk and total % chunk:
            raise ConfigError(
                f"train.logprob_chunk = {chunk} does not divide prompt_len + max_new_tokens = "
                f"{total}; pick a divisor (or 0 for unchunked)")
        group = self.prompt_group
        if not isinstance(group, int) or group < 1 or self.micro_batch % group:
            raise ConfigError(
                f"train.prompt_group = {group!r}: must be a positive divisor of micro_batch = "
                f"{self.micro_batch} (the rows answering one prompt; 1 = no sharing)")
        if self.loss_chunk != (chunk or total):
            raise ConfigError(
                f"train.loss_chunk = {self.loss_chunk!r}: in a grpo bundle it is the log-prob "
                f"chunk ({chunk or total}); set train.logprob_chunk instead")

    def to_json(self) -> dict:
        document = {"kind": self.kind, "micro_batch": self.micro_batch, "seq_len": self.seq_len,
                    "param_dtype": self.param_dtype, "compute_dtype": self.compute_dtype,
                    "remat": self.remat, "loss_chunk": self.loss_chunk,
                    "attention": self.attention}
        if self.attention == "blockwise":
            document["attention_block"] = self.attention_block
        if self.optimizer_offload:
            document["optimizer_offload"] = True
        if self.lora_rank:
            document["lora"] = {"rank": self.lora_rank, "alpha": self.lora_alpha,
                                "targets": list(self.lora_targets),
                                "base_dtype": self.lora_base_dtype}
        if self.kind == "grpo":
            document.update(prompt_len=self.prompt_len, max_new_tokens=self.max_new_tokens,
                            logprob_chunk=self.logprob_chunk)
            if self.prompt_group > 1:
                document["prompt_group"] = self.prompt_group
        elif self.decodes:
            document.update(prompt_len=self.prompt_len, max_new_tokens=self.max_new_tokens)
        return document


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW's hyperparameters except the learning rate, which the host passes every step."""

    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0

    def validate(self) -> None:
        for field in ("b1", "b2"):
            value = getattr(self, field)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"optimizer.{field} = {value!r}: must be in [0, 1)")
        if not self.eps > 0.0:
            raise ConfigError(f"optimizer.eps = {self.eps!r}: must be > 0")
        if not self.weight_decay >= 0.0:
            raise ConfigError(f"optimizer.weight_decay = {self.weight_decay!r}: must be >= 0")
        if not self.max_grad_norm > 0.0:
            raise ConfigError(f"optimizer.max_grad_norm = {self.max_grad_norm!r}: must be > 0")

    def to_json(self) -> dict:
        return {"name": "adamw", **dataclasses.asdict(self)}


@dataclass(frozen=True)
class MeshConfig:
    """The ICI mesh of one slice: sizes of the `fsdp` and `tp` axes, in `axes` order."""

    axes: tuple[tuple[str, int], ...] = (("fsdp", 1), ("tp", 1))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.axes)

    @property
    def num_devices(self) -> int:
        n = 1
        for size in self.sizes:
            n *= size
        return n

    def size(self, name: str) -> int:
        return dict(self.axes).get(name, 1)

    def to_json(self) -> list:
        return [{"name": name, "size": size} for name, size in self.axes]


def parse_mesh(text: str) -> MeshConfig:
    """Parses `fsdp=2,tp=2` (either order; a missing axis has size 1 and goes last)."""
    axes: list[tuple[str, int]] = []
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip()
        if not sep:
            raise ConfigError(f"mesh = {text!r}: write axes as name=size, e.g. fsdp=2,tp=2")
        if name not in MESH_AXES + (SEQUENCE_AXIS,):
            raise ConfigError(
                f"mesh = {text!r}: axis {name!r} is unknown; the axes are "
                f"{', '.join(MESH_AXES + (SEQUENCE_AXIS,))}")
        if any(name == seen for seen, _ in axes):
            raise ConfigError(f"mesh = {text!r}: axis {name!r} appears twice")
        try:
            size = int(value)
        except ValueError:
            raise ConfigError(
                f"mesh = {text!r}: size of axis {name!r} is {value!r}, not an integer") from None
        if size <= 0:
            raise ConfigError(f"mesh = {text!r}: axis {name!r} has size {size}; it must be >= 1")
        axes.append((name, size))
    for name in MESH_AXES:
        if all(name != seen for seen, _ in axes):
            axes.append((name, 1))
    return MeshConfig(tuple(axes))


def check_mesh_fits(model: ModelConfig, train: TrainConfig, mesh: MeshConfig) -> None:
    """Refuses a mesh that does not split every sharded dimension into equal shards."""
    fsdp, tp, sp = mesh.size("fsdp"), mesh.size("tp"), mesh.size(SEQUENCE_AXIS)
    checks = [
        ("model.num_heads", model.num_heads, "tp", tp),
        ("model.num_kv_heads", model.num_kv_heads, "tp", tp),
        ("model.intermediate_size", model.intermediate_size, "tp", tp),
        ("model.vocab_size", model.vocab_size, "tp", tp),
        ("model.hidden_size", model.hidden_size, "fsdp x sp", fsdp * sp),
        ("train.micro_batch", train.micro_batch, "fsdp", fsdp),
        ("train.seq_len", train.seq_len, "sp", sp),
    ]
    if SEQUENCE_AXIS in mesh.names and (train.kind != "sft" or train.lora_rank):
        raise ConfigError(f"mesh axis {SEQUENCE_AXIS!r}: only plain SFT bundles take a sequence "
                          f"axis (it is for measurement); drop it")
    for field, value, axis, size in checks:
        if value % size:
            raise ConfigError(
                f"{field} = {value} is not divisible by mesh axis {axis}={size}; choose a mesh "
                f"whose {axis} size divides {value}")
