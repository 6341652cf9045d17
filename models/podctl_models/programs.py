"""A bundle's programs (docs/BUNDLE.md) as flat-argument functions plus signatures.

Each program takes and returns flat positional arrays in the manifest's order, so the exported
module's arguments are exactly the manifest's inputs. SFT bundles have `init`, `zero_grads`,
`grad_step`, `apply_step`, and `rollout` when they have decode buffers (held-out evaluation);
GRPO bundles share `init`, `zero_grads`, `apply_step` and add `rollout`, `logprobs`,
`grpo_grad_step`. Either kind may carry the optional `logits` program
(full float32 logits of a batch, for parity tests against other implementations); only a bundle
exported with it asks for it, so training bundles never compile it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from . import grpo, optim, qwen3, rollout
from .config import ModelConfig, OptimizerConfig, TrainConfig

# Program names per train kind, in the order the exporter writes them.
PROGRAM_NAMES = {
    "sft": ("init", "zero_grads", "grad_step", "apply_step"),
    "grpo": ("init", "zero_grads", "apply_step", "rollout", "logprobs", "grpo_grad_step"),
}
# Programs a bundle carries only when the exporter is asked for them (`--with-logits`).
OPTIONAL_PROGRAMS = ("logits",)


def program_names(train: TrainConfig, optional: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The programs a bundle of `train` carries, in the order the exporter writes them."""
    names = PROGRAM_NAMES[train.kind]
    if train.kind == "sft" and train.decodes:
        names += ("rollout",)
    return names + tuple(optional)


@dataclass(frozen=True)
class TensorSpec:
    """One argument or result: name, global shape, NumPy dtype name, mesh axis per dimension."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    spec: tuple[str | None, ...]
    # None: device memory; "pinned_host" for AdamW state offloaded to the host.
    memory_kind: str | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(jnp.dtype(self.dtype)).itemsize

    def shard_bytes(self, mesh_sizes: dict[str, int]) -> int:
        """Bytes of one device's shard."""
        axes = [a for axis in self.spec if axis is not None
                for a in (axis if isinstance(axis, tuple) else (axis,))]
        shards = math.prod(mesh_sizes[a] for a in axes)
        return self.nbytes // shards

    def manifest(self, donated: bool | None = None) -> dict:
        entry = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                 "sharding": [[] if axis is None else list(axis) if isinstance(axis, tuple)
                              else [axis] for axis in self.spec]}
        if donated is not None:
            entry["donated"] = donated
        if self.memory_kind is not None:
            entry["memory_kind"] = self.memory_kind
        return entry


@dataclass(frozen=True)
class Program:
    """A program's function and signature; `donated` holds indices into `inputs`."""

    name: str
    fn: Callable
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    donated: frozenset[int]


def _scalar(name: str, dtype: str) -> TensorSpec:
    return TensorSpec(name, (), dtype, ())


def build_programs(model: ModelConfig, train: TrainConfig, opt: OptimizerConfig,
                   mesh=None, optional: tuple[str, ...] = ()) -> dict[str, Program]:
    """The programs for one (model, train, optimizer) setting, plus the `optional` ones asked for
    (from `OPTIONAL_PROGRAMS`).

    `mesh` (a Mesh or AbstractMesh) enables activation sharding constraints; None is for plain
    single-device use.
    """
    specs = trainable_specs(model, train, () if mesh is None else mesh.axis_names)
    paths = [s.path for s in specs]
    decay = {s.path: s.decays for s in specs}
    pdtype = train.param_dtype

    def group(prefix, memory_kind=None):
        return tuple(TensorSpec(f"{prefix}/{s.path}", s.shape, pdtype, s.spec, memory_kind)
                     for s in specs)

    # Offloaded AdamW state lives in host memory between steps (`apply_step` brings each moment
    # to the device and back), so the programs that hold it on the device hold only parameters,
    # gradients and activations.
    moments_kind = HOST_MEMORY if train.optimizer_offload else None
    params, grads = group("params"), group("grads")
    mu, nu = group("opt/mu", moments_kind), group("opt/nu", moments_kind)
    frozen = frozen_tensors(model, train)
    n = len(paths)

    def as_dict(values):
        return dict(zip(paths, values))

    def as_list(tree):
        return [tree[p] for p in paths]

    def init(seed):
        moments = [jnp.zeros(s.shape, pdtype) for s in specs]
        if not frozen:
            p = qwen3.init_params(model, seed, jnp.dtype(pdtype))
            return (*as_list(p), *moments, *moments)
        # LoRA: the base exactly as a full bundle's init draws it, then the adapters.
        base = qwen3.init_params(model, seed, jnp.dtype(train.lora_base_dtype))
        adapters = qwen3.init_lora(model, train, seed, jnp.dtype(pdtype))
        return (*(base[s.path] for s in qwen3.param_specs(model)), *as_list(adapters),
                *moments, *moments)

    def zero_grads():
        return tuple(jnp.zeros(s.shape, pdtype) for s in specs)

    def apply_step(*args):
        p, m, v, g = (as_dict(args[i * n:(i + 1) * n]) for i in range(4))
        step, learning_rate, grad_scale = args[4 * n:]
        chain = OffloadChain(specs, mesh) if moments_kind else None
        p, m, v, norm = optim.adamw_apply(p, m, v, g, step, learning_rate, grad_scale, decay, opt,
                                          fetch=chain and chain.fetch, store=chain and chain.store)
        zeros = [jnp.zeros_like(g[k]) for k in paths]
        return (*as_list(p), *as_list(m), *as_list(v), *zeros, norm)

    common = {
        "init": Program("init", init, (_scalar("seed", "uint32"),), frozen + params + mu + nu,
                        frozenset()),
        "zero_grads": Program("zero_grads", zero_grads, (), grads, frozenset()),
        "apply_step": Program(
            "apply_step", apply_step,
            params + mu + nu + grads + (_scalar("step", "int32"),
                                        _scalar("learning_rate", "float32"),
                                        _scalar("grad_scale", "float32")),
            params + mu + nu + grads + (_scalar("grad_norm", "float32"),),
            frozenset(range(4 * n))),
    }
    if frozen:
        extra = _lora_programs(model, train, mesh, frozen, params, grads, as_dict)
    else:
        build = _sft_programs if train.kind == "sft" else _grpo_programs
        extra = build(model, train, mesh, params, grads, as_dict)
    programs = {**common, **extra}
    if train.kind == "sft" and train.decodes:
        programs["rollout"] = _rollout_program(model, train, mesh, params, as_dict)
    if "logits" in optional:
        programs["logits"] = _logits_program(model, train, mesh, frozen, params, as_dict)
    return {name: programs[name] for name in program_names(train, optional)}


def _logits_program(model, train, mesh, frozen, params, as_dict) -> Program:
    """`logits(frozen, params, batch/tokens)`: float32 `[rows, seq, vocab]` logits, no padding."""
    f, n = len(frozen), len(params)
    rows, seq = train.micro_batch, train.seq_len
    base_paths = [s.path for s in qwen3.param_specs(model)]

    def logits_fn(*args):
        p = {**dict(zip(base_paths, args[:f])), **as_dict(args[f:f + n])}
        return (qwen3.logits(p, args[f + n], model, train, mesh=mesh),)

    tokens = _rows("batch/tokens", "int32", rows, seq)
    return Program("logits", logits_fn, frozen + params + (tokens,),
                   (_rows("logits", "float32", rows, seq, model.vocab_size),), frozenset())


HOST_MEMORY = "pinned_host"


class OffloadChain:
    """Moves AdamW's moments between host and device one parameter at a time.

    Each parameter's moments come to the device only after the previous parameter's new moments
    have left it (an optimization barrier orders the transfers), so the device holds one
    parameter's moments at a time rather than all of them: without the chain XLA brings every
    moment in at once and `apply_step` needs as much device memory as without offload.
    """

    def __init__(self, specs: list[qwen3.ParamSpec], mesh):
        if mesh is None:
            raise ValueError("optimizer offload needs a mesh: memory kinds belong to shardings")

        def sharding(spec, kind):
            return NamedSharding(mesh, P(*spec.spec), memory_kind=kind)

        self.device = {s.path: sharding(s, "device") for s in specs}
        self.host = {s.path: sharding(s, HOST_MEMORY) for s in specs}
        self.previous = None

    def fetch(self, path, m, v):
        if self.previous is not None:
            m, v, _ = jax.lax.optimization_barrier((m, v, self.previous))
        return jax.device_put(m, self.device[path]), jax.device_put(v, self.device[path])

    def store(self, path, m, v):
        m, v = jax.device_put(m, self.host[path]), jax.device_put(v, self.host[path])
        self.previous = (m, v)
        return m, v


def trainable_specs(model: ModelConfig, train: TrainConfig,
                    mesh_names=()) -> list[qwen3.ParamSpec]:
    """What gets gradients and AdamW state: every parameter, or only LoRA's adapters (split over
    `fsdp` and `sp` together on a mesh with a sequence axis)."""
    specs = qwen3.lora_specs(model, train) if train.lora_rank else qwen3.param_specs(model)
    return qwen3.with_sequence_axis(specs, mesh_names)


def frozen_tensors(model: ModelConfig, train: TrainConfig) -> tuple[TensorSpec, ...]:
    """A LoRA bundle's frozen base (`frozen/<path>` in `lora_base_dtype`); empty otherwise."""
    if not train.lora_rank:
        return ()
    return tuple(TensorSpec(f"frozen/{s.path}", s.shape, train.lora_base_dtype, s.spec)
                 for s in qwen3.param_specs(model))


def _lora_programs(model, train, mesh, frozen, params, grads, as_dict) -> dict[str, Program]:
    """SFT with LoRA: `grad_step(frozen, params, grads, batch)`, gradients for the adapters only
    (the base is a constant of the differentiation: no gradient or optimizer state for it)."""
    f, n = len(frozen), len(params)
    base_paths = [s.path for s in qwen3.param_specs(model)]
    rows, seq = train.micro_batch, train.seq_len
    batch = (_rows("batch/tokens", "int32", rows, seq), _rows("batch/targets", "int32", rows, seq),
             _rows("batch/loss_mask", "float32", rows, seq))

    def grad_step(*args):
        base = dict(zip(base_paths, args[:f]))
        p, g = as_dict(args[f:f + n]), as_dict(args[f + n:f + 2 * n])
        tokens, targets, loss_mask = args[f + 2 * n:]

        def loss_fn(adapters):
            return qwen3.sft_loss({**base, **adapters}, tokens, targets, loss_mask, model, train,
                                  mesh)

        (loss_sum, token_count), step_grads = jax.value_and_grad(loss_fn, has_aux=True)(p)
        new_grads = [g[k] + step_grads[k].astype(g[k].dtype) for k in g]
        return (*new_grads, loss_sum, token_count)

    return {"grad_step": Program(
        "grad_step", grad_step, frozen + params + grads + batch,
        grads + (_scalar("loss_sum", "float32"), _scalar("token_count", "float32")),
        frozenset(range(f + n, f + 2 * n)))}


def _rows(name: str, dtype: str, rows: int, *width: int) -> TensorSpec:
    """A per-row tensor: `[rows, *width]`, rows split over `fsdp` like every batch."""
    return TensorSpec(name, (rows, *width), dtype, ("fsdp",) + (None,) * len(width))


def _sft_programs(model, train, mesh, params, grads, as_dict) -> dict[str, Program]:
    n = len(params)
    rows, seq = train.micro_batch, train.seq_len
    batch = (_rows("batch/tokens", "int32", rows, seq), _rows("batch/targets", "int32", rows, seq),
             _rows("batch/loss_mask", "float32", rows, seq))

    def grad_step(*args):
        p, g = as_dict(args[:n]), as_dict(args[n:2 * n])
        tokens, targets, loss_mask = args[2 * n:]

        def loss_fn(p):
            return qwen3.sft_loss(p, tokens, targets, loss_mask, model, train, mesh)

        (loss_sum, token_count), step_grads = jax.value_and_grad(loss_fn, has_aux=True)(p)
        new_grads = [g[k] + step_grads[k].astype(g[k].dtype) for k in g]
        return (*new_grads, loss_sum, token_count)

    return {"grad_step": Program(
        "grad_step", grad_step, params + grads + batch,
        grads + (_scalar("loss_sum", "float32"), _scalar("token_count", "float32")),
        frozenset(range(n, 2 * n)))}


def _rollout_program(model, train, mesh, params, as_dict) -> Program:
    """Sampling `max_new_tokens` after left-padded prompts of `prompt_len` (GRPO's rollouts;
    greedy at temperature 0, held-out evaluation of either kind)."""
    n, rows = len(params), train.micro_batch

    def rollout_fn(*args):
        return rollout.generate(as_dict(args[:n]), *args[n:], model, train, mesh)

    inputs = (_rows("prompt/tokens", "int32", rows, train.prompt_len),
              _rows("prompt/lengths", "int32", rows),
              _rows("sample/seeds", "uint32", rows), _scalar("sample/temperature", "float32"),
              _scalar("sample/top_p", "float32"),
              TensorSpec("sample/stop_ids", (rollout.STOP_IDS,), "int32", (None,)),
              _scalar("sample/pad_id", "int32"))
    outputs = (_rows("completion/tokens", "int32", rows, train.max_new_tokens),
               _rows("completion/lengths", "int32", rows),
               _rows("completion/logprobs", "float32", rows, train.max_new_tokens))
    return Program("rollout", rollout_fn, params + inputs, outputs, frozenset())


def divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of `n` not above `limit`; 0 (unchunked) for a `limit` of 0."""
    if limit <= 0:
        return 0
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _grpo_programs(model, train, mesh, params, grads, as_dict) -> dict[str, Program]:
    n = len(params)
    rows, seq = train.micro_batch, train.seq_len
    prompt_len, new_tokens = train.prompt_len, train.max_new_tokens
    shard = qwen3.Sharder(mesh)

    group = qwen3.shared_prompt_group(train, mesh)

    def policy_logprobs(p, tokens, targets, prompt_lengths, temperature):
        head = qwen3.output_head(p)
        if group > 1:
            return shared_prompt_logprobs(p, head, tokens, targets, prompt_lengths, temperature)
        start = rollout.left_padding(prompt_lengths, prompt_len)
        hidden = qwen3.hidden_states(p, tokens, model, train, mesh, start=start)
        return grpo.token_logprobs(hidden, head.astype(hidden.dtype), targets, temperature,
                                   train.logprob_chunk, shard)

    def shared_prompt_logprobs(p, head, tokens, targets, prompt_lengths, temperature):
        """`[rows, seq]` log-probs with each group's prompt run once. Only the positions that
        predict a completion token (`prompt_len - 1 ..`, where a loss mask can be non-zero)
        are computed; the others are 0."""
        start = rollout.left_padding(prompt_lengths[::group], prompt_len)
        hp, hc = qwen3.shared_prompt_hidden(p, tokens[::group, :prompt_len], tokens[:, prompt_len:],
                                            start, model, train, mesh)
        # The prompt's last position predicts the first completion token of each of its rows.
        last = jnp.repeat(hp[:, -1:], group, axis=0)
        hidden = jnp.concatenate([last, hc[:, :new_tokens - 1]], axis=1)
        wanted = targets[:, prompt_len - 1:prompt_len - 1 + new_tokens]
        logprobs = grpo.token_logprobs(hidden, head.astype(hidden.dtype), wanted, temperature,
                                       divisor_at_most(new_tokens, train.logprob_chunk), shard)
        return jnp.pad(logprobs, ((0, 0), (prompt_len - 1, 1)))

    def logprobs_fn(*args):
        return (policy_logprobs(as_dict(args[:n]), *args[n:]),)

    def grpo_grad_step(*args):
        p, g = as_dict(args[:n]), as_dict(args[n:2 * n])
        (tokens, targets, prompt_lengths, loss_mask, advantages, old_logprobs, ref_logprobs,
         temperature, clip_low, clip_high, kl_beta) = args[2 * n:]

        def loss_fn(p):
            logprobs = policy_logprobs(p, tokens, targets, prompt_lengths, temperature)
            return grpo.grpo_objective(logprobs, old_logprobs, ref_logprobs, advantages,
                                       loss_mask, clip_low, clip_high, kl_beta)

        (loss_sum, metrics), step_grads = jax.value_and_grad(loss_fn, has_aux=True)(p)
        new_grads = [g[k] + step_grads[k].astype(g[k].dtype) for k in g]
        return (*new_grads, loss_sum, jnp.sum(loss_mask),
                *(metrics[name] for name in grpo.METRIC_NAMES))

    sequence = (_rows("batch/tokens", "int32", rows, seq),
                _rows("batch/targets", "int32", rows, seq),
                _rows("batch/prompt_lengths", "int32", rows))
    temperature = _scalar("sample/temperature", "float32")
    grpo_batch = sequence + (_rows("batch/loss_mask", "float32", rows, seq),
                             _rows("batch/advantages", "float32", rows),
                             _rows("batch/old_logprobs", "float32", rows, seq),
                             _rows("batch/ref_logprobs", "float32", rows, seq),
                             temperature, _scalar("grpo/clip_low", "float32"),
                             _scalar("grpo/clip_high", "float32"),
                             _scalar("grpo/kl_beta", "float32"))
    metrics = tuple(_scalar(name, "float32")
                    for name in ("loss_sum", "token_count", *grpo.METRIC_NAMES))
    return {
        "rollout": _rollout_program(model, train, mesh, params, as_dict),
        "logprobs": Program("logprobs", logprobs_fn, params + sequence + (temperature,),
                            (_rows("logprobs", "float32", rows, seq),), frozenset()),
        "grpo_grad_step": Program("grpo_grad_step", grpo_grad_step, params + grads + grpo_batch,
                                  grads + metrics, frozenset(range(n, 2 * n))),
    }
