"""The Qwen3 decoder in plain JAX: parameters are a flat dict of arrays keyed by path.

Layers are stacked on a leading `[num_layers]` axis and run with `lax.scan`, so a 28-layer model
traces and compiles one layer body. Shardings follow the ICI mesh `(fsdp, tp)`: matrices stored
`[in, out]` split `(fsdp, tp)` for the projections into heads/MLP and `(tp, fsdp)` for the
projections back to the residual stream, the embedding's vocabulary over `tp`, norms replicated,
and activations' batch over `fsdp`.

The output head is the embedding (`tie_embeddings`, Qwen3 up to 4B) or, untied (Qwen3-8B and
larger), a parameter `lm_head` of the embedding's own layout `[vocab, hidden]` split `(tp, fsdp)`:
Hugging Face stores `lm_head.weight` `[vocab, hidden]` too, and every logits computation reads
whichever `output_head` returns, so the two cases share one code path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from .config import ModelConfig, TrainConfig
from . import attention as attention_lib
from . import loss as loss_lib

Params = dict[str, jax.Array]


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: where it lives in the model, its global shape, and how it is split."""

    path: str
    shape: tuple[int, ...]
    # Mesh axis per dimension (None = not split); JAX's PartitionSpec as a tuple.
    spec: tuple[str | None, ...]
    # Standard deviation of its normal init; None means "initialized to ones" (norm scales).
    init_std: float | None
    # Rank of one layer's slice (the stacked layer axis not counted): AdamW decays only matrices.
    layer_rank: int

    @property
    def decays(self) -> bool:
        return self.layer_rank >= 2


def param_specs(model: ModelConfig) -> list[ParamSpec]:
    """The parameters in canonical order (the manifest's `params` order)."""
    L, H, I = model.num_layers, model.hidden_size, model.intermediate_size
    q_out = model.num_heads * model.head_dim
    kv_out = model.num_kv_heads * model.head_dim
    # Scaled normal: unit-variance activations through each matrix, and the projections back into
    # the residual stream shrunk by the depth so the stream's variance stays bounded.
    residual_scale = 1.0 / math.sqrt(2 * L)

    def matrix(path, fan_in, fan_out, spec, scale=1.0):
        return ParamSpec(path, (L, fan_in, fan_out), (None, *spec), scale / math.sqrt(fan_in), 2)

    def norm(path, size):
        return ParamSpec(path, (L, size), (None, None), None, 1)

    return [
        ParamSpec("embed", (model.vocab_size, H), ("tp", "fsdp"), 1.0 / math.sqrt(H), 2),
        norm("layers/input_norm", H),
        matrix("layers/q_proj", H, q_out, ("fsdp", "tp")),
        matrix("layers/k_proj", H, kv_out, ("fsdp", "tp")),
        matrix("layers/v_proj", H, kv_out, ("fsdp", "tp")),
        norm("layers/q_norm", model.head_dim),
        norm("layers/k_norm", model.head_dim),
        matrix("layers/o_proj", q_out, H, ("tp", "fsdp"), residual_scale),
        norm("layers/post_norm", H),
        matrix("layers/gate_proj", H, I, ("fsdp", "tp")),
        matrix("layers/up_proj", H, I, ("fsdp", "tp")),
        matrix("layers/down_proj", I, H, ("tp", "fsdp"), residual_scale),
        ParamSpec("final_norm", (H,), (None,), None, 1),
    ] + ([] if model.tie_embeddings else
         [ParamSpec("lm_head", (model.vocab_size, H), ("tp", "fsdp"), 1.0 / math.sqrt(H), 2)])


def output_head(params: Params) -> jax.Array:
    """The `[vocab, hidden]` matrix the logits are computed with: `lm_head` when the model has one
    (untied), else the embedding."""
    return params["lm_head"] if "lm_head" in params else params["embed"]


def lora_specs(model: ModelConfig, train: TrainConfig) -> list[ParamSpec]:
    """The LoRA adapters (the trainable parameters of a `lora_rank > 0` bundle): for each target
    projection `layers/P` stored `[L, in, out]`, `layers/P.lora_a` `[L, in, r]` (split like the
    matrix's input dimension, init normal 1/sqrt(in)) and `layers/P.lora_b` `[L, r, out]` (split
    like its output dimension, init zero: training starts at the base model)."""
    r = train.lora_rank
    result = []
    for spec in param_specs(model):
        name = spec.path.removeprefix("layers/")
        if not spec.path.startswith("layers/") or name not in train.lora_targets:
            continue
        L, fan_in, fan_out = spec.shape
        result.append(ParamSpec(spec.path + LORA_A, (L, fan_in, r), (None, spec.spec[1], None),
                                1.0 / math.sqrt(fan_in), 2))
        result.append(ParamSpec(spec.path + LORA_B, (L, r, fan_out), (None, None, spec.spec[2]),
                                0.0, 2))
    return result


def init_lora(model: ModelConfig, train: TrainConfig, seed: jax.Array, dtype: Any) -> Params:
    """Adapters from a uint32 seed, drawn from a key apart from the base parameters' keys."""
    key = jax.random.fold_in(jax.random.key(seed), 0x10A)
    params = {}
    for index, spec in enumerate(lora_specs(model, train)):
        if spec.init_std == 0.0:
            params[spec.path] = jnp.zeros(spec.shape, dtype)
        else:
            draw = jax.random.normal(jax.random.fold_in(key, index), spec.shape, jnp.float32)
            params[spec.path] = (draw * spec.init_std).astype(dtype)
    return params


def num_params(model: ModelConfig) -> int:
    return sum(math.prod(s.shape) for s in param_specs(model))


def init_params(model: ModelConfig, seed: jax.Array, dtype: Any) -> Params:
    """Deterministic init from a uint32 seed: parameter `i` draws from `fold_in(key(seed), i)`.

    Threefry is partitionable in this JAX, so the values do not depend on the mesh.
    """
    key = jax.random.key(seed)
    params = {}
    for index, spec in enumerate(param_specs(model)):
        if spec.init_std is None:
            params[spec.path] = jnp.ones(spec.shape, dtype)
        else:
            draw = jax.random.normal(jax.random.fold_in(key, index), spec.shape, jnp.float32)
            params[spec.path] = (draw * spec.init_std).astype(dtype)
    return params


# The time dimension of an activation: split over the mesh's sequence axis when it has one.
SEQ = "seq"


class Sharder:
    """Applies activation sharding constraints on `mesh`; does nothing without a mesh. A `SEQ`
    entry is the sequence axis (`sp`) when the mesh has one, unsplit otherwise."""

    def __init__(self, mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None):
        self.mesh = mesh
        self.seq = "sp" if mesh is not None and "sp" in mesh.axis_names else None

    def __call__(self, x: jax.Array, *spec: str | None) -> jax.Array:
        if self.mesh is None:
            return x
        spec = tuple(self.seq if axis == SEQ else axis for axis in spec)
        return lax.with_sharding_constraint(x, NamedSharding(self.mesh, P(*spec)))


def with_sequence_axis(specs: list[ParamSpec], mesh_names) -> list[ParamSpec]:
    """`specs` with every `fsdp` split over `fsdp` and `sp` together when the mesh has `sp`."""
    if "sp" not in mesh_names:
        return specs
    joint = ("fsdp", "sp")
    return [ParamSpec(s.path, s.shape, tuple(joint if a == "fsdp" else a for a in s.spec),
                      s.init_std, s.layer_rank) for s in specs]


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, statistics in float32 (as Qwen3 does), result in x's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return normed.astype(x.dtype) * weight.astype(x.dtype)


def rope_tables(positions: jax.Array, head_dim: int, theta: float,
                dtype: Any) -> tuple[jax.Array, jax.Array]:
    """cos/sin `[rows, seq, head_dim]` for rotate-half RoPE (the Hugging Face Qwen3 layout) at
    `positions` `[rows, seq]` (rows may be 1 to broadcast over the batch)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: `[batch, seq, ..., head_dim]`; cos/sin: `[batch or 1, seq, head_dim]`."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    shape = (cos.shape[0], cos.shape[1]) + (1,) * (x.ndim - 3) + (cos.shape[2],)
    return x * cos.reshape(shape) + rotated * sin.reshape(shape)


def positions_and_mask(seq: int, start: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """RoPE positions `[rows, seq]` and the attention mask `[rows, seq, seq]` (query, key).

    `start[b]` is the column of row b's first real token (left padding before it): positions
    count from there, and no query sees a padding key. Without `start` there is no padding and
    both broadcast over rows (`rows = 1`).
    """
    query = lax.broadcasted_iota(jnp.int32, (1, seq, seq), 1)
    key = lax.broadcasted_iota(jnp.int32, (1, seq, seq), 2)
    causal = query >= key
    columns = jnp.arange(seq, dtype=jnp.int32)[None, :]
    if start is None:
        return columns, causal
    start = start.astype(jnp.int32)
    positions = jnp.maximum(columns - start[:, None], 0)
    return positions, causal & (key >= start[:, None, None])


def project_qkv(x, layer, cos, sin, model: ModelConfig, shard: Sharder):
    """Queries `[b, t, kv, group, hd]` (normed, rotated, scaled), keys and values
    `[b, t, kv, hd]`."""
    batch, seq, _ = x.shape
    kv, group, hd = model.num_kv_heads, model.num_heads // model.num_kv_heads, model.head_dim
    dtype = x.dtype
    q = project(x, layer, "layers/q_proj").reshape(batch, seq, kv, group, hd)
    k = project(x, layer, "layers/k_proj").reshape(batch, seq, kv, hd)
    v = project(x, layer, "layers/v_proj").reshape(batch, seq, kv, hd)
    # Queries keep their time split over the sequence axis; keys and values are gathered whole.
    q = shard(q, "fsdp", SEQ, "tp", None, None)
    k = shard(k, "fsdp", None, "tp", None)
    v = shard(v, "fsdp", None, "tp", None)
    q = apply_rope(rms_norm(q, layer["layers/q_norm"], model.rms_norm_eps), cos, sin)
    k = apply_rope(rms_norm(k, layer["layers/k_norm"], model.rms_norm_eps), cos, sin)
    return q * jnp.asarray(hd ** -0.5, dtype), k, v


LORA_A, LORA_B, LORA_SCALE = ".lora_a", ".lora_b", "lora/scale"


def project(x, layer, path):
    """`x @ W` for the matrix at `path`, plus the LoRA update `(x @ A) @ B * scale` when the
    layer carries adapters `path + ".lora_a"` `[in, r]` and `path + ".lora_b"` `[r, out]`."""
    dtype = x.dtype
    y = x @ layer[path].astype(dtype)
    if path + LORA_A in layer:
        low = x @ layer[path + LORA_A].astype(dtype)
        y = y + (low @ layer[path + LORA_B].astype(dtype)) * jnp.asarray(layer[LORA_SCALE], dtype)
    return y


def attention_core(q, k, v, mask):
    """Plain XLA attention before the output projection: q `[b, t, kv, g, hd]` over keys/values
    `[b, s, kv, hd]`; mask `[b or 1, t, s]`; result `[b, t, kv, g, hd]`."""
    # Scores and softmax in float32 whatever the compute dtype.
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v)


def attend(q, k, v, mask, layer):
    """q `[b, t, kv, g, hd]` over keys/values `[b, s, kv, hd]`; mask `[b or 1, t, s]`."""
    batch, seq = q.shape[:2]
    out = attention_core(q, k, v, mask)
    return project(out.reshape(batch, seq, -1), layer, "layers/o_proj")


def mlp(x, layer, shard: Sharder):
    gate = shard(project(x, layer, "layers/gate_proj"), "fsdp", SEQ, "tp")
    up = shard(project(x, layer, "layers/up_proj"), "fsdp", SEQ, "tp")
    return project(jax.nn.silu(gate) * up, layer, "layers/down_proj")


_REMAT_POLICIES = {
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}


def remat_policy(train: TrainConfig):
    """The layer body's checkpoint policy. With LoRA, `dots` does not save the adapters'
    up-projections `(x @ A) @ B` (`[rows, seq, out]` each, as large as the base projection they
    are added to, and recomputed from the saved `[rows, seq, r]` `x @ A` by an r-deep matmul):
    saving them would double what `dots` keeps per projection."""
    policy = _REMAT_POLICIES[train.remat]
    if train.remat != "dots" or not train.lora_rank:
        return policy
    rank = train.lora_rank

    def lora_dots(prim, *avals, **params):
        if prim is lax.dot_general_p and avals[1].ndim == 2 and avals[1].shape[0] == rank \
                and avals[0].shape[-1] == rank:
            return False
        return policy(prim, *avals, **params)

    return lora_dots


def layer_params(params: Params) -> Params:
    """The stacked per-layer parameters, the `xs` of the scan over layers."""
    return {path: value for path, value in params.items() if path.startswith("layers/")}


def hidden_states(params: Params, tokens: jax.Array, model: ModelConfig, train: TrainConfig,
                  mesh=None, start: jax.Array | None = None, return_kv: bool = False):
    """The final-normed hidden states `[batch, seq, hidden]` in the compute dtype.

    `start` `[batch]` marks left padding (see `positions_and_mask`). With `return_kv`, also the
    keys and values of every layer, `[num_layers, batch, seq, kv_heads, head_dim]` each, for a
    KV cache.
    """
    shard = Sharder(mesh)
    dtype = jnp.dtype(train.compute_dtype)
    x = jnp.take(params["embed"], tokens, axis=0).astype(dtype)
    x = shard(x, "fsdp", SEQ, None)
    seq = tokens.shape[1]
    impl = train.attention
    if impl == "xla":
        positions, mask = positions_and_mask(seq, start)
    else:
        # No [seq, seq] mask: blockwise and Pallas attention build theirs per block.
        columns = jnp.arange(seq, dtype=jnp.int32)[None, :]
        positions = columns if start is None else jnp.maximum(
            columns - start.astype(jnp.int32)[:, None], 0)
    cos, sin = rope_tables(positions, model.head_dim, model.rope_theta, dtype)

    def attention(q, k, v):
        if impl == "xla":
            return attention_core(q, k, v, mask)
        if impl == "blockwise":
            return attention_lib.blockwise_attention(q, k, v, start, train.attention_block)
        if impl == "pallas":
            return attention_lib.pallas_attention(q, k, v, start, mesh)
        raise ValueError(f"train.attention = {impl!r}")

    def layer_body(x, layer):
        if train.lora_rank:
            layer = {**layer, LORA_SCALE: train.lora_alpha / train.lora_rank}
        h = rms_norm(x, layer["layers/input_norm"], model.rms_norm_eps)
        q, k, v = project_qkv(h, layer, cos, sin, model, shard)
        out = attention(q, k, v)
        out = project(out.reshape(*out.shape[:2], -1), layer, "layers/o_proj")
        x = shard(x + out, "fsdp", SEQ, None)
        h = rms_norm(x, layer["layers/post_norm"], model.rms_norm_eps)
        x = shard(x + mlp(h, layer, shard), "fsdp", SEQ, None)
        return x, ((k, v) if return_kv else None)

    if train.remat != "none":
        layer_body = jax.checkpoint(layer_body, policy=remat_policy(train), prevent_cse=False)
    x, kv = lax.scan(layer_body, x, layer_params(params))
    hidden = rms_norm(x, params["final_norm"], model.rms_norm_eps)
    return (hidden, kv) if return_kv else hidden


def shared_prompt_group(train: TrainConfig, mesh) -> int:
    """The rows per prompt the GRPO programs compute the prompt once for: `train.prompt_group`
    where the shared-prompt path applies (XLA attention, whole groups on every `fsdp` shard, no
    sequence axis), else 1."""
    group = train.prompt_group
    if group <= 1 or train.attention != "xla":
        return 1
    if mesh is not None:
        sizes = dict(mesh.shape)
        if "sp" in sizes or (train.micro_batch // group) % sizes.get("fsdp", 1):
            return 1
    return group


def shared_prompt_hidden(params: Params, prompts: jax.Array, completions: jax.Array,
                         start: jax.Array, model: ModelConfig, train: TrainConfig, mesh=None):
    """Final-normed hidden states of rows that share prompts, each prompt computed once.

    `prompts` `[groups, P]` (left-padded, `start` `[groups]` as in `positions_and_mask`) and
    `completions` `[groups * G, C]`: rows `i * G .. (i + 1) * G` continue prompt `i`. The result
    is `(prompt_hidden [groups, P, hidden], completion_hidden [groups * G, C, hidden])`, what
    `hidden_states` gives for the rows `[prompt | completion]` (prompt positions are causal, so
    the G copies of a prompt agree), with the prompts' work done once instead of G times.
    """
    shard = Sharder(mesh)
    dtype = jnp.dtype(train.compute_dtype)
    (groups, prompt_len), (rows, new) = prompts.shape, completions.shape
    group = rows // groups
    embed = params["embed"]
    xp = shard(jnp.take(embed, prompts, axis=0).astype(dtype), "fsdp", SEQ, None)
    xc = shard(jnp.take(embed, completions, axis=0).astype(dtype), "fsdp", SEQ, None)
    positions, prompt_mask = positions_and_mask(prompt_len, start)
    cos_p, sin_p = rope_tables(positions, model.head_dim, model.rope_theta, dtype)
    row_start = jnp.repeat(start.astype(jnp.int32), group)
    after = (prompt_len - row_start)[:, None] + jnp.arange(new, dtype=jnp.int32)[None, :]
    cos_c, sin_c = rope_tables(after, model.head_dim, model.rope_theta, dtype)
    prompt_keys = jnp.arange(prompt_len, dtype=jnp.int32)[None, :] >= start.astype(jnp.int32)[:, None]
    causal = jnp.tril(jnp.ones((new, new), bool))

    def completion_attention(q, k, v, kp, vp):
        """Completion queries `[rows, C, kv, g, hd]` over their prompt's keys (shared by the
        group, never copied G times) and their own causal keys, one softmax over both."""
        kv, g, hd = q.shape[2:]
        q5 = q.reshape(groups, group, new, kv, g, hd)
        low = jnp.finfo(jnp.float32).min
        on_prompt = jnp.einsum("bnckgd,bskd->bnkgcs", q5, kp, preferred_element_type=jnp.float32)
        on_prompt = jnp.where(prompt_keys[:, None, None, None, None, :], on_prompt, low)
        own = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
        own = jnp.where(causal, own.reshape(groups, group, kv, g, new, new), low)
        probs = jax.nn.softmax(jnp.concatenate([on_prompt, own], axis=-1), axis=-1).astype(q.dtype)
        out = jnp.einsum("bnkgcs,bskd->bnckgd", probs[..., :prompt_len], vp)
        own_probs = probs[..., prompt_len:].reshape(rows, kv, g, new, new)
        return out.reshape(q.shape) + jnp.einsum("bkgts,bskd->btkgd", own_probs, v)

    def layer_body(carry, layer):
        xp, xc = carry
        if train.lora_rank:
            layer = {**layer, LORA_SCALE: train.lora_alpha / train.lora_rank}
        hp = rms_norm(xp, layer["layers/input_norm"], model.rms_norm_eps)
        hc = rms_norm(xc, layer["layers/input_norm"], model.rms_norm_eps)
        qp, kp, vp = project_qkv(hp, layer, cos_p, sin_p, model, shard)
        qc, kc, vc = project_qkv(hc, layer, cos_c, sin_c, model, shard)
        op = attention_core(qp, kp, vp, prompt_mask)
        oc = completion_attention(qc, kc, vc, kp, vp)
        xp = shard(xp + project(op.reshape(groups, prompt_len, -1), layer, "layers/o_proj"),
                   "fsdp", SEQ, None)
        xc = shard(xc + project(oc.reshape(rows, new, -1), layer, "layers/o_proj"),
                   "fsdp", SEQ, None)
        hp = rms_norm(xp, layer["layers/post_norm"], model.rms_norm_eps)
        hc = rms_norm(xc, layer["layers/post_norm"], model.rms_norm_eps)
        xp = shard(xp + mlp(hp, layer, shard), "fsdp", SEQ, None)
        xc = shard(xc + mlp(hc, layer, shard), "fsdp", SEQ, None)
        return (xp, xc), None

    if train.remat != "none":
        layer_body = jax.checkpoint(layer_body, policy=remat_policy(train), prevent_cse=False)
    (xp, xc), _ = lax.scan(layer_body, (xp, xc), layer_params(params))
    norm = params["final_norm"]
    return rms_norm(xp, norm, model.rms_norm_eps), rms_norm(xc, norm, model.rms_norm_eps)


def sft_loss(params: Params, tokens: jax.Array, targets: jax.Array, loss_mask: jax.Array,
             model: ModelConfig, train: TrainConfig, mesh=None, chunked: bool = True):
    """`(loss_sum, token_count)`: summed float32 cross-entropy over the masked targets."""
    hidden = hidden_states(params, tokens, model, train, mesh)
    head = output_head(params).astype(hidden.dtype)
    if chunked:
        loss_sum = loss_lib.chunked_loss_sum(hidden, head, targets, loss_mask, train.loss_chunk,
                                             Sharder(mesh))
    else:
        loss_sum = loss_lib.loss_sum(hidden, head, targets, loss_mask, Sharder(mesh))
    return loss_sum, jnp.sum(loss_mask)


def logits(params: Params, tokens: jax.Array, model: ModelConfig, train: TrainConfig,
           start: jax.Array | None = None, mesh=None) -> jax.Array:
    """Full float32 logits `[batch, seq, vocab]`; for tests and sampling, never for training."""
    hidden = hidden_states(params, tokens, model, train, mesh, start=start)
    return jnp.einsum("bth,vh->btv", hidden, output_head(params).astype(hidden.dtype),
                      preferred_element_type=jnp.float32)
