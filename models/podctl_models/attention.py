"""Attention implementations for the train step, chosen by `train.attention`.

- `xla`: plain attention (`qwen3.attend`): the `[rows, heads, T, T]` float32 scores and
  probabilities are formed whole; XLA keeps them for the backward.
- `blockwise`: online softmax over key blocks in pure JAX (any platform). A scan over blocks of
  `block` keys keeps a running max, denominator and float32 output per query; the backward is a
  custom VJP that recomputes each block's probabilities from the saved per-query max and
  denominator (flash attention's backward), so neither pass holds more than
  `[rows, heads, T, block]` scores at once and the residuals are O(T).
- `pallas`: `jax.experimental.pallas.ops.tpu.flash_attention` inside a `shard_map` over the
  mesh (TPU bundles only). A CPU bundle asking for it falls back to `blockwise` with a note on
  stderr (`resolve`), because Mosaic kernels lower only for TPUs.

All take queries `[b, t, kv, group, hd]` already scaled by `hd ** -0.5` and keys/values
`[b, s, kv, hd]`, with a causal mask plus optional left padding: `start[b]` is row b's first real
column, and no query sees a key before it. A query that sees no key at all (a padding query)
gets the mean of all values, as plain attention's `finfo.min` masking gives it.
"""

from __future__ import annotations

import sys
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

ATTENTION_IMPLS = ("xla", "blockwise", "pallas")
DEFAULT_BLOCK = 512
_MASKED = float(jnp.finfo(jnp.float32).min)


def resolve(attention: str, platform: str) -> str:
    """The implementation a bundle for `platform` lowers: `pallas` on CPU becomes `blockwise`."""
    if attention == "pallas" and platform != "tpu":
        print("note: train.attention = 'pallas' is a TPU kernel (Mosaic); the cpu bundle uses "
              "'blockwise' attention instead (same math, pure JAX)", file=sys.stderr)
        return "blockwise"
    return attention


def block_size(seq: int, block: int = DEFAULT_BLOCK) -> int:
    """The largest divisor of `seq` not above `block`."""
    block = min(block, seq)
    while seq % block:
        block -= 1
    return block


def _block_mask(t: int, s0, bk: int, start):
    """`[b or 1, t, bk]` visibility of keys `s0 .. s0 + bk` from every query."""
    query = lax.broadcasted_iota(jnp.int32, (1, t, bk), 1)
    key = lax.broadcasted_iota(jnp.int32, (1, t, bk), 2) + s0
    visible = query >= key
    if start is not None:
        visible = visible & (key >= start.astype(jnp.int32)[:, None, None])
    return visible


def _scores(q, kb, mask):
    """float32 `[b, kv, g, t, bk]` scores of one key block, masked entries at finfo.min."""
    s = jnp.einsum("btkgd,bskd->bkgts", q, kb, preferred_element_type=jnp.float32)
    return jnp.where(mask[:, None, None], s, _MASKED)


def _blocks(x, bk):
    """`[b, s, kv, hd]` -> `[n, b, bk, kv, hd]` for a scan over key blocks."""
    b, s = x.shape[:2]
    return jnp.moveaxis(x.reshape(b, s // bk, bk, *x.shape[2:]), 1, 0)


def _forward(q, k, v, start, bk):
    b, t, kv, g, hd = q.shape
    n = k.shape[1] // bk

    def body(carry, xs):
        m, l, acc = carry
        kb, vb, j = xs
        s = _scores(q, kb, _block_mask(t, j * bk, bk, start))
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        scale = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[..., None])
        l = l * scale + jnp.sum(p, axis=-1)
        pv = jnp.einsum("bkgts,bskd->bkgtd", p.astype(vb.dtype), vb,
                        preferred_element_type=jnp.float32)
        return (m_new, l, acc * scale[..., None] + pv), None

    init = (jnp.full((b, kv, g, t), _MASKED, jnp.float32), jnp.zeros((b, kv, g, t), jnp.float32),
            jnp.zeros((b, kv, g, t, hd), jnp.float32))
    (m, l, acc), _ = lax.scan(body, init, (_blocks(k, bk), _blocks(v, bk), jnp.arange(n)))
    out = jnp.moveaxis(acc / l[..., None], 3, 1).astype(q.dtype)  # [b, t, kv, g, hd]
    return out, m, l


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _blockwise(q, k, v, start, bk):
    return _forward(q, k, v, start, bk)[0]


def _blockwise_fwd(q, k, v, start, bk):
    out, m, l = _forward(q, k, v, start, bk)
    return out, (q, k, v, start, out, m, l)


def _blockwise_bwd(bk, residuals, d_out):
    q, k, v, start, out, m, l = residuals
    b, t, kv, g, hd = q.shape
    n = k.shape[1] // bk
    d_out = d_out.astype(jnp.float32)
    # D_i = sum_d dO_i O_i: the softmax backward's row term.
    delta = jnp.einsum("btkgd,btkgd->bkgt", d_out, out.astype(jnp.float32))
    d_out_c = d_out.astype(q.dtype)

    def body(dq, xs):
        kb, vb, j = xs
        mask = _block_mask(t, j * bk, bk, start)[:, None, None]
        s = _scores(q, kb, mask[:, 0, 0])
        p = jnp.exp(s - m[..., None]) / l[..., None]                     # [b, kv, g, t, bk]
        dv = jnp.einsum("bkgts,btkgd->bskd", p.astype(q.dtype), d_out_c,
                        preferred_element_type=jnp.float32)
        dp = jnp.einsum("btkgd,bskd->bkgts", d_out_c, vb, preferred_element_type=jnp.float32)
        # Masked scores are constants (finfo.min): no gradient reaches q or k through them,
        # also for a padding query that sees no key (p is uniform there, as in plain attention).
        ds = jnp.where(mask, p * (dp - delta[..., None]), 0.0).astype(q.dtype)
        dq = dq + jnp.einsum("bkgts,bskd->btkgd", ds, kb, preferred_element_type=jnp.float32)
        dk = jnp.einsum("bkgts,btkgd->bskd", ds, q, preferred_element_type=jnp.float32)
        return dq, (dk.astype(kb.dtype), dv.astype(vb.dtype))

    dq, (dk, dv) = lax.scan(body, jnp.zeros(q.shape, jnp.float32),
                            (_blocks(k, bk), _blocks(v, bk), jnp.arange(n)))

    def unblock(x):  # [n, b, bk, kv, hd] -> [b, s, kv, hd]
        return jnp.moveaxis(x, 0, 1).reshape(k.shape)

    d_start = None if start is None else jnp.zeros(start.shape, jax.dtypes.float0)
    return dq.astype(q.dtype), unblock(dk), unblock(dv), d_start


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def blockwise_attention(q, k, v, start=None, block: int = DEFAULT_BLOCK):
    """Causal attention `[b, t, kv, g, hd]` by online softmax over key blocks (see the module
    docstring); `block` is rounded down to a divisor of the key length."""
    if start is not None:
        start = start.astype(jnp.int32)
    return _blockwise(q, k, v, start, block_size(k.shape[1], block))


def pallas_attention(q, k, v, start, mesh):
    """TPU flash attention (Pallas/Mosaic) per shard: rows over `fsdp`, kv heads over `tp`.

    Queries are already scaled (`sm_scale = 1`). Left padding becomes segment ids (padding 0,
    real tokens 1), so a real query sees no padding key; the kernel's padding queries differ
    from plain attention's (their outputs are never used: no loss reads them).
    """
    from jax.experimental.pallas.ops.tpu import flash_attention as fa
    from jax.sharding import PartitionSpec as P

    b, t, kv, g, hd = q.shape

    def local(q, k, v, start):
        lb = q.shape[0]
        lkv = q.shape[2]
        qh = jnp.moveaxis(q.reshape(lb, t, lkv * g, hd), 1, 2)           # [b, h, t, hd]
        kh = jnp.repeat(jnp.moveaxis(k, 1, 2), g, axis=1)                # [b, h, s, hd]
        vh = jnp.repeat(jnp.moveaxis(v, 1, 2), g, axis=1)
        segment_ids = None
        if start is not None:
            ids = (jnp.arange(t, dtype=jnp.int32)[None, :] >= start[:, None]).astype(jnp.int32)
            segment_ids = fa.SegmentIds(q=ids, kv=ids)
        out = fa.flash_attention(qh, kh, vh, segment_ids=segment_ids, causal=True, sm_scale=1.0)
        return jnp.moveaxis(out, 1, 2).reshape(lb, t, lkv, g, hd)

    if mesh is None:
        return local(q, k, v, start)
    qkv_spec = P("fsdp", None, "tp")
    args = (q, k, v) + (() if start is None else (start.astype(jnp.int32),))
    specs = (qkv_spec, qkv_spec, qkv_spec) + (() if start is None else (P("fsdp"),))
    fn = (lambda q, k, v: local(q, k, v, None)) if start is None else local
    return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=qkv_spec,
                         check_vma=False)(*args)
