"""Sampling completions: prefill the prompts once, then decode with a KV cache.

Buffers have fixed shapes. Prompts are left-padded into `[rows, prompt_len]`, so every row's
first completion token sits at column `prompt_len` and all rows write the cache at the same
column each step; `prompt_lengths` says where each row's real tokens start (RoPE positions count
from there and no query sees a padding key). Completions fill `[rows, max_new_tokens]`: a row
stops after the first of its stop ids it emits (a chat model stops at the end of its turn and at
the end of text: `STOP_IDS` slots, unused ones holding -1, which no token is) and the rest of it
is PAD. The decode loop is a `lax.while_loop` that ends
as soon as every row has stopped.

Sampling is deterministic given the per-row seeds: step `t` of a row draws from
`fold_in(key(seed), t)`, so a row's completion does not depend on which other rows share its
batch. Temperature `<= 0` is greedy (argmax, first index on ties). Top-p keeps the smallest set
of most likely tokens whose probability reaches `top_p` (all tokens tied at the boundary are
kept), found by bisection on the float bits of the probability threshold: 31 reductions over a
vocabulary that stays split over `tp`, where a sort would gather it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from . import qwen3
from .config import ModelConfig, TrainConfig
from .grpo import effective_temperature

# Bisection over the int32 bits of a non-negative float32 threshold: 2^31 candidates.
_THRESHOLD_STEPS = 31

# Slots of the `stop_ids` input: more than any tokenizer's `generation_config.json` lists (Qwen3
# has 2, Llama 3 has 3). Part of the bundle format (docs/BUNDLE.md).
STOP_IDS = 8


def left_padding(prompt_lengths: jax.Array, prompt_len: int) -> jax.Array:
    """Column of each row's first real token in a `[rows, prompt_len]` left-padded prompt
    buffer (lengths clamped to `[1, prompt_len]`); also where real tokens start in a full
    `[rows, prompt_len + max_new_tokens]` sequence built from it."""
    return prompt_len - jnp.clip(prompt_lengths.astype(jnp.int32), 1, prompt_len)


def nucleus(probs: jax.Array, top_p: jax.Array) -> jax.Array:
    """Boolean `[rows, vocab]`: the top-p nucleus of each row of `probs`.

    The largest threshold `tau` (one of the row's probabilities) with
    `sum(probs[probs >= tau]) >= top_p`, found exactly by bisecting its float bits (non-negative
    floats order like their bits). `top_p >= total mass` keeps every token; `top_p <= 0` keeps
    the most likely ones only.
    """
    probs = probs.astype(jnp.float32)

    def mass(threshold_bits):
        threshold = lax.bitcast_convert_type(threshold_bits, jnp.float32)
        return jnp.sum(jnp.where(probs >= threshold[:, None], probs, 0.0), axis=-1)

    # Invariant: mass(low) >= top_p (or low = 0), mass(high) < top_p (or high = max + 1 ulp).
    low = jnp.zeros(probs.shape[:1], jnp.int32)
    high = lax.bitcast_convert_type(jnp.max(probs, axis=-1), jnp.int32) + 1

    def step(_, bounds):
        low, high = bounds
        middle = low + (high - low) // 2
        enough = mass(middle) >= top_p
        return jnp.where(enough, middle, low), jnp.where(enough, high, middle)

    low, _ = lax.fori_loop(0, _THRESHOLD_STEPS, step, (low, high))
    return probs >= lax.bitcast_convert_type(low, jnp.float32)[:, None]


def sample(logits: jax.Array, keys: jax.Array, temperature: jax.Array,
           top_p: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One token per row from float32 `logits` `[rows, vocab]` with per-row `keys` `[rows]`.

    Returns `(tokens, logprobs)`: int32 `[rows]` and the float32 log-prob of each token under
    `softmax(logits / T)`, T the effective temperature (1 when greedy), before top-p truncation:
    the distribution the policy is trained on (`grpo.token_logprobs` gives the same numbers).
    """
    logits = logits.astype(jnp.float32)
    scaled = logits / effective_temperature(temperature)
    # The same arithmetic as grpo.token_logprobs, so the two agree to the hidden states' rounding.
    log_norm = jax.nn.logsumexp(scaled, axis=-1)

    def truncate():
        return nucleus(jnp.exp(scaled - log_norm[:, None]), top_p)

    def keep_all():
        return jnp.ones(logits.shape, bool)

    # Skip the bisection (31 cross-device reductions per step) when nothing is truncated.
    keep = lax.cond(top_p < 1.0, truncate, keep_all)
    gumbel = jax.vmap(lambda key: jax.random.gumbel(key, logits.shape[1:], jnp.float32))(keys)
    # Gumbel-max draws exactly from softmax(scaled) restricted to the nucleus.
    drawn = jnp.argmax(jnp.where(keep, scaled + gumbel, -jnp.inf), axis=-1)
    greedy = jnp.argmax(logits, axis=-1)
    tokens = jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)
    vocab_ids = lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    chosen = jnp.sum(jnp.where(vocab_ids == tokens[:, None], scaled, 0.0), axis=-1)
    return tokens, chosen - log_norm


def _decode_layers(params: qwen3.Params, tokens: jax.Array, positions: jax.Array,
                   column: jax.Array, cache: tuple[jax.Array, jax.Array], attention,
                   per_layer: tuple, model: ModelConfig, train: TrainConfig,
                   shard: qwen3.Sharder):
    """One decode step of `tokens` `[rows]` at RoPE `positions` `[rows]`: the layers, each
    writing its keys/values at `column` of `cache` `[num_layers, rows, columns, kv_heads,
    head_dim]` (every row the same column: one dynamic slice per layer, in place) and attending
    through `attention(q, layer_keys, layer_values, *per_layer[layer])` (the output before
    `o_proj`). Returns float32 logits `[rows, vocab]` and the cache."""
    dtype = jnp.dtype(train.compute_dtype)
    rows = tokens.shape[0]
    x = shard(jnp.take(params["embed"], tokens, axis=0).astype(dtype)[:, None, :], "fsdp", None, None)
    cos, sin = qwen3.rope_tables(positions[:, None], model.head_dim, model.rope_theta, dtype)

    def layer_body(carry, xs):
        x, keys, values = carry
        layer, index, *extra = xs
        h = qwen3.rms_norm(x, layer["layers/input_norm"], model.rms_norm_eps)
        q, k, v = qwen3.project_qkv(h, layer, cos, sin, model, shard)
        at = (index, 0, column, 0, 0)
        keys = lax.dynamic_update_slice(keys, k[None].astype(keys.dtype), at)
        values = lax.dynamic_update_slice(values, v[None].astype(values.dtype), at)
        out = attention(q, lax.dynamic_index_in_dim(keys, index, keepdims=False),
                        lax.dynamic_index_in_dim(values, index, keepdims=False), *extra)
        x = shard(x + qwen3.project(out.reshape(rows, 1, -1), layer, "layers/o_proj"),
                  "fsdp", None, None)
        h = qwen3.rms_norm(x, layer["layers/post_norm"], model.rms_norm_eps)
        x = shard(x + qwen3.mlp(h, layer, shard), "fsdp", None, None)
        return (x, keys, values), None

    xs = (qwen3.layer_params(params), jnp.arange(model.num_layers, dtype=jnp.int32), *per_layer)
    (x, keys, values), _ = lax.scan(layer_body, (x, *cache), xs)
    hidden = qwen3.rms_norm(x, params["final_norm"], model.rms_norm_eps)[:, 0]
    head = qwen3.output_head(params).astype(hidden.dtype)
    logits = jnp.einsum("bh,vh->bv", hidden, head, preferred_element_type=jnp.float32)
    return shard(logits, "fsdp", "tp"), (keys, values)


def decode_step(params: qwen3.Params, tokens: jax.Array, column: jax.Array, start: jax.Array,
                cache: tuple[jax.Array, jax.Array], model: ModelConfig, train: TrainConfig,
                shard: qwen3.Sharder):
    """Runs `tokens` `[rows]` at `column` against the KV cache; returns float32 logits
    `[rows, vocab]` for the next token and the cache with this column's keys/values written.

    The cache is `[num_layers, rows, total_len, kv_heads, head_dim]` (keys, values).
    """
    key_columns = jnp.arange(cache[0].shape[2], dtype=jnp.int32)[None, :]
    mask = ((key_columns >= start[:, None]) & (key_columns <= column))[:, None, :]
    return _decode_layers(params, tokens, jnp.maximum(column - start, 0), column, cache,
                          lambda q, k, v: qwen3.attention_core(q, k, v, mask), (),
                          model, train, shard)


def decode_step_shared(params: qwen3.Params, tokens: jax.Array, index: jax.Array,
                       start: jax.Array, prompt_cache: tuple[jax.Array, jax.Array],
                       cache: tuple[jax.Array, jax.Array], model: ModelConfig,
                       train: TrainConfig, shard: qwen3.Sharder):
    """`decode_step` for rows in groups that share a prompt (`qwen3.shared_prompt_group`): each
    group's prompt keys/values are read once for its G rows instead of from G copies.

    `prompt_cache` is `[num_layers, groups, prompt_len, kv_heads, head_dim]` (the group's
    prefill, `start` `[rows]` equal within a group); `cache` `[num_layers, rows, max_new_tokens,
    kv_heads, head_dim]` holds the completions' own keys/values, `tokens` are written at its
    column `index`. One softmax over the prompt's columns then the completion's, as the per-row
    cache orders them.
    """
    rows = tokens.shape[0]
    groups, prompt_len = prompt_cache[0].shape[1:3]
    group, new = rows // groups, cache[0].shape[2]
    prompt_mask = jnp.arange(prompt_len, dtype=jnp.int32)[None, :] >= start[::group, None]
    own_mask = jnp.arange(new, dtype=jnp.int32) <= index
    low = jnp.finfo(jnp.float32).min

    def attention(q, keys, values, prompt_keys, prompt_values):
        kv, g, hd = q.shape[2:]
        q = q[:, 0]
        on_prompt = jnp.einsum("nckgd,nskd->nckgs", q.reshape(groups, group, kv, g, hd),
                               prompt_keys, preferred_element_type=jnp.float32)
        on_prompt = jnp.where(prompt_mask[:, None, None, None, :], on_prompt, low)
        own = jnp.einsum("bkgd,bskd->bkgs", q, keys, preferred_element_type=jnp.float32)
        own = jnp.where(own_mask, own, low)
        scores = jnp.concatenate([on_prompt.reshape(rows, kv, g, prompt_len), own], axis=-1)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        out = jnp.einsum("nckgs,nskd->nckgd",
                         probs[..., :prompt_len].reshape(groups, group, kv, g, prompt_len),
                         prompt_values).reshape(rows, kv, g, hd)
        return out + jnp.einsum("bkgs,bskd->bkgd", probs[..., prompt_len:], values)

    return _decode_layers(params, tokens, prompt_len + index - start, index, cache, attention,
                          prompt_cache, model, train, shard)


def generate(params: qwen3.Params, prompts: jax.Array, prompt_lengths: jax.Array,
             seeds: jax.Array, temperature: jax.Array, top_p: jax.Array, stop_ids: jax.Array,
             pad_id: jax.Array, model: ModelConfig, train: TrainConfig, mesh=None):
    """Completions of left-padded `prompts` `[rows, prompt_len]`.

    `prompt_lengths` `[rows]` are clamped to `[1, prompt_len]`; `stop_ids` `[STOP_IDS]` are the
    ids a row stops at (-1 in unused slots). Returns `(tokens, lengths, logprobs)`: int32
    `[rows, max_new_tokens]` (the stop id then PAD once a row stops), int32 `[rows]` generated
    tokens per row counting its stop id, and float32 `[rows, max_new_tokens]` log-probs of the
    tokens (see `sample`; 0 after a row stops).
    """
    shard = qwen3.Sharder(mesh)
    rows, prompt_len = prompts.shape
    new_tokens = train.max_new_tokens
    stop_ids, pad_id = stop_ids.astype(jnp.int32), pad_id.astype(jnp.int32)
    start = left_padding(prompt_lengths, prompt_len)

    # Prefill: one pass over the prompts fills the cache's first prompt_len columns.
    def prefill(prompts, start):
        hidden, (keys, values) = qwen3.hidden_states(params, prompts, model, train, mesh,
                                                     start=start, return_kv=True)
        return hidden[:, -1], keys, values

    def cache_layout(c):
        return shard(c, None, "fsdp", None, "tp", None)

    row_keys = jax.vmap(jax.random.key)(seeds.astype(jnp.uint32))

    def draw(logits, t):
        step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, t)
        return sample(shard(logits, "fsdp", "tp"), step_keys, temperature, top_p)

    def record(state, t, tokens, logprobs):
        out_tokens, out_logprobs, lengths, done = state
        active = ~done
        tokens = jnp.where(active, tokens, pad_id)
        logprobs = jnp.where(active, logprobs, 0.0)
        out_tokens = lax.dynamic_update_slice(out_tokens, tokens[:, None], (0, t))
        out_logprobs = lax.dynamic_update_slice(out_logprobs, logprobs[:, None], (0, t))
        lengths = jnp.where(active, t + 1, lengths)
        stops = jnp.any(tokens[:, None] == stop_ids[None, :], axis=-1)
        return (out_tokens, out_logprobs, lengths, done | (active & stops)), tokens

    def decode(last_hidden, step, cache):
        """Samples from the prefill's last hidden states on; `step(last, t, cache)` gives the
        next logits and the cache with token `t - 1` written."""
        head = qwen3.output_head(params).astype(last_hidden.dtype)
        logits = jnp.einsum("bh,vh->bv", last_hidden, head, preferred_element_type=jnp.float32)
        empty = (shard(jnp.full((rows, new_tokens), pad_id, jnp.int32), "fsdp", None),
                 shard(jnp.zeros((rows, new_tokens), jnp.float32), "fsdp", None),
                 jnp.zeros((rows,), jnp.int32), jnp.zeros((rows,), bool))
        t0 = jnp.int32(0)
        outputs, last = record(empty, t0, *draw(logits, t0))

        # State: (tokens produced so far, the last of them, outputs, cache).
        def keep_going(state):
            t, _, outputs, _ = state
            return (t < new_tokens) & ~jnp.all(outputs[3])

        def body(state):
            t, last, outputs, cache = state
            logits, cache = step(last, t, cache)
            outputs, last = record(outputs, t, *draw(logits, t))
            return t + 1, last, outputs, cache

        _, _, (tokens, logprobs, lengths, _), _ = lax.while_loop(
            keep_going, body, (jnp.int32(1), last, outputs, cache))
        return tokens, lengths, logprobs

    def per_row(_):
        last_hidden, keys, values = prefill(prompts, start)
        padding = ((0, 0), (0, 0), (0, new_tokens), (0, 0), (0, 0))
        cache = tuple(cache_layout(jnp.pad(c, padding)) for c in (keys, values))
        return decode(last_hidden, lambda last, t, cache: decode_step(
            params, last, prompt_len + t - 1, start, cache, model, train, shard), cache)

    group = qwen3.shared_prompt_group(train, mesh)
    if group == 1:
        return per_row(None)

    def per_group(_):
        last_hidden, keys, values = prefill(prompts[::group], start[::group])
        prompt_cache = tuple(cache_layout(c) for c in (keys, values))
        own_shape = (keys.shape[0], rows, new_tokens, *keys.shape[3:])
        cache = tuple(cache_layout(jnp.zeros(own_shape, c.dtype)) for c in (keys, values))
        return decode(jnp.repeat(last_hidden, group, axis=0), lambda last, t, cache: decode_step_shared(
            params, last, t - 1, start, prompt_cache, cache, model, train, shard), cache)

    # GRPO's rows come in groups answering one prompt: prefill each prompt once and decode
    # against its one cache. Checked on the values, so other batches (held-out evaluation) take
    # the per-row path.
    grouped = prompts.reshape(rows // group, group, prompt_len)
    shared = jnp.all(grouped == grouped[:, :1]) & jnp.all(
        start.reshape(rows // group, group) == start[::group, None])
    return lax.cond(shared, per_group, per_row, None)
