"""Per-token log-probs and the GRPO objective, summed over tokens like the SFT loss.

Log-probs are computed `chunk` time steps at a time in a scan whose body is under
`jax.checkpoint`: the forward pass holds one chunk's `[batch, chunk, vocab]` float32 logits, and
the backward pass recomputes them chunk by chunk, so `[batch, seq, vocab]` never exists (seed
001's compute-and-discard, done by the compiler). The vocabulary is already split over `tp`, so
a chunk's logits are `[batch/fsdp, chunk, vocab/tp]` per device; chunking the vocabulary too
would need an online logsumexp and saves nothing a smaller time chunk does not.

`chunk = 0` is the plain computation that materializes all logits; it exists to measure what
chunking saves.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax


def _no_sharding(x, *spec):
    return x


def effective_temperature(temperature: jax.Array) -> jax.Array:
    """The temperature log-probs are taken at: `temperature`, or 1 when it is <= 0 (greedy
    decoding has no distribution of its own; its tokens are scored by the model's)."""
    temperature = jnp.asarray(temperature, jnp.float32)
    return jnp.where(temperature > 0, temperature, jnp.float32(1.0))


def _chunk_logprobs(hidden, embed, targets, temperature, shard):
    """hidden `[b, c, h]`, embed `[v, h]`, targets `[b, c]` -> `[b, c]` float32 log-probs."""
    logits = jnp.einsum("bch,vh->bcv", hidden, embed, preferred_element_type=jnp.float32)
    logits = shard(logits, "fsdp", None, "tp") / temperature
    log_norm = jax.nn.logsumexp(logits, axis=-1)
    # A masked select + sum rather than a gather: it partitions cleanly when vocab is split.
    vocab_ids = lax.broadcasted_iota(jnp.int32, logits.shape, 2)
    target_logit = jnp.sum(jnp.where(vocab_ids == targets[..., None], logits, 0.0), axis=-1)
    return target_logit - log_norm


def token_logprobs(hidden: jax.Array, embed: jax.Array, targets: jax.Array,
                   temperature: jax.Array, chunk: int,
                   shard: Callable = _no_sharding) -> jax.Array:
    """`[batch, seq]` float32 `log softmax(hidden @ embed.T / T)[targets]`, T the effective
    temperature; `chunk` time steps at a time (0 = all at once). `chunk` divides seq."""
    batch, seq, width = hidden.shape
    temperature = effective_temperature(temperature)
    if chunk == 0:
        return _chunk_logprobs(hidden, embed, targets, temperature, shard)
    if seq % chunk:
        raise ValueError(f"logprob_chunk = {chunk} does not divide seq_len = {seq}")
    num_chunks = seq // chunk
    # Time-major chunks so scan walks the leading axis.
    hidden = hidden.reshape(batch, num_chunks, chunk, width).swapaxes(0, 1)
    targets = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)

    @partial(jax.checkpoint, prevent_cse=False)
    def chunk_logprobs(hidden_c, targets_c):
        return _chunk_logprobs(hidden_c, embed, targets_c, temperature, shard)

    def body(carry, xs):
        return carry, chunk_logprobs(*xs)

    _, logprobs = lax.scan(body, None, (hidden, targets))
    return logprobs.swapaxes(0, 1).reshape(batch, seq)


METRIC_NAMES = ("kl_sum", "clipped_count", "ratio_sum", "ratio_min", "ratio_max")


def grpo_objective(logprobs: jax.Array, old_logprobs: jax.Array, ref_logprobs: jax.Array,
                   advantages: jax.Array, loss_mask: jax.Array, clip_low: jax.Array,
                   clip_high: jax.Array, kl_beta: jax.Array):
    """`(loss_sum, metrics)` for the policy's per-token `logprobs` `[batch, seq]`.

    Per token with `mask != 0`: ratio `r = exp(logp - old)`, advantage `A` of its row,
    policy term `-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)`, KL to the reference by the
    k3 estimator `exp(ref - logp) - (ref - logp) - 1` (non-negative, unbiased), and
    `loss = policy + kl_beta * kl`. `loss_sum = sum(mask * loss)`: a sum, so micro-batches and
    slices add up exactly; the host divides by the token count of the whole batch.

    Positions with `mask == 0` are ignored entirely (their old/ref values may be anything,
    even inf): differences are replaced by 0 there before any exp, so no NaN leaks into
    gradients. `metrics` (no gradient): `kl_sum = sum(mask * kl)`, `clipped_count` = weight of
    tokens whose policy term is clipped (it has no gradient), `ratio_sum = sum(mask * r)`, and
    `ratio_min`/`ratio_max` over counted tokens (+inf/-inf when none counts).
    """
    valid = loss_mask != 0
    advantages = advantages.astype(jnp.float32)[:, None]
    log_ratio = jnp.where(valid, logprobs - old_logprobs, 0.0)
    ratio = jnp.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    policy = -jnp.minimum(unclipped, clipped)
    log_ref_ratio = jnp.where(valid, ref_logprobs - logprobs, 0.0)
    kl = jnp.exp(log_ref_ratio) - log_ref_ratio - 1.0
    loss_sum = jnp.sum(jnp.where(valid, loss_mask * (policy + kl_beta * kl), 0.0))

    ratio, kl = lax.stop_gradient(ratio), lax.stop_gradient(kl)
    is_clipped = lax.stop_gradient(clipped < unclipped)
    metrics = {
        "kl_sum": jnp.sum(jnp.where(valid, loss_mask * kl, 0.0)),
        "clipped_count": jnp.sum(jnp.where(valid & is_clipped, loss_mask, 0.0)),
        "ratio_sum": jnp.sum(jnp.where(valid, loss_mask * ratio, 0.0)),
        "ratio_min": jnp.min(jnp.where(valid, ratio, jnp.inf)),
        "ratio_max": jnp.max(jnp.where(valid, ratio, -jnp.inf)),
    }
    return loss_sum, metrics
