"""The SFT loss: a sum of float32 cross-entropy over masked target tokens.

The chunked version never holds `[batch, seq, vocab]` float32 logits: it scans over time chunks
of `loss_chunk` steps, and `jax.checkpoint` on the chunk makes the backward pass recompute one
chunk's logits at a time instead of saving them all.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax


def _no_sharding(x, *spec):
    return x


def _chunk_loss_sum(hidden, embed, targets, loss_mask, shard):
    """hidden `[b, c, h]`, embed `[v, h]`, targets/mask `[b, c]` -> scalar float32 sum."""
    logits = jnp.einsum("bch,vh->bcv", hidden, embed, preferred_element_type=jnp.float32)
    logits = shard(logits, "fsdp", None, "tp")
    log_norm = jax.nn.logsumexp(logits, axis=-1)
    # A masked select + sum rather than a gather: it partitions cleanly when vocab is split.
    vocab_ids = lax.broadcasted_iota(jnp.int32, logits.shape, 2)
    target_logit = jnp.sum(jnp.where(vocab_ids == targets[..., None], logits, 0.0), axis=-1)
    return jnp.sum((log_norm - target_logit) * loss_mask)


def loss_sum(hidden: jax.Array, embed: jax.Array, targets: jax.Array, loss_mask: jax.Array,
             shard: Callable = _no_sharding) -> jax.Array:
    """Unchunked reference: materializes all logits. For tests."""
    return _chunk_loss_sum(hidden, embed, targets, loss_mask, shard)


def chunked_loss_sum(hidden: jax.Array, embed: jax.Array, targets: jax.Array,
                     loss_mask: jax.Array, chunk: int, shard: Callable = _no_sharding) -> jax.Array:
    """Same value as `loss_sum`, computed `chunk` time steps at a time (chunk divides seq)."""
    batch, seq, width = hidden.shape
    if seq % chunk:
        raise ValueError(f"loss_chunk = {chunk} does not divide seq_len = {seq}")
    num_chunks = seq // chunk
    # Time-major chunks so scan walks the leading axis.
    hidden = hidden.reshape(batch, num_chunks, chunk, width).swapaxes(0, 1)
    targets = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)
    loss_mask = loss_mask.reshape(batch, num_chunks, chunk).swapaxes(0, 1)

    @partial(jax.checkpoint, prevent_cse=False)
    def chunk_sum(hidden_c, targets_c, mask_c):
        return _chunk_loss_sum(hidden_c, embed, targets_c, mask_c, shard)

    def body(total, xs):
        return total + chunk_sum(*xs), None

    total, _ = lax.scan(body, jnp.zeros((), jnp.float32), (hidden, targets, loss_mask))
    return total
