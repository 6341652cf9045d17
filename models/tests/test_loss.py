"""The chunked loss equals the plain one, and never holds the float32 logits of a whole batch."""

import re

import jax
import numpy as np

from podctl_models import loss

from conftest import assert_close_to_scale

BATCH, SEQ, WIDTH, VOCAB, CHUNK = 4, 64, 32, 96, 16


def inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(BATCH, SEQ, WIDTH)).astype(np.float32)
    embed = rng.normal(scale=0.3, size=(VOCAB, WIDTH)).astype(np.float32)
    targets = rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int32)
    mask = (rng.random((BATCH, SEQ)) < 0.6).astype(np.float32)
    return hidden, embed, targets, mask


def test_matches_a_direct_cross_entropy():
    hidden, embed, targets, mask = inputs()
    logits = hidden.astype(np.float64) @ embed.T.astype(np.float64)
    log_probs = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1,
                                       keepdims=True)) - logits.max(-1, keepdims=True)
    picked = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    want = -np.sum(picked * mask)
    got = jax.jit(loss.chunked_loss_sum, static_argnums=4)(hidden, embed, targets, mask, CHUNK)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_chunked_value_and_gradients_equal_unchunked():
    hidden, embed, targets, mask = inputs(1)

    def chunked(h, e):
        return loss.chunked_loss_sum(h, e, targets, mask, CHUNK)

    def plain(h, e):
        return loss.loss_sum(h, e, targets, mask)

    value_c, grads_c = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1)))(hidden, embed)
    value_p, grads_p = jax.jit(jax.value_and_grad(plain, argnums=(0, 1)))(hidden, embed)
    np.testing.assert_allclose(float(value_c), float(value_p), rtol=1e-5)
    for got, want in zip(grads_c, grads_p):
        assert_close_to_scale(got, want, 1e-5)
    # Masked-out positions get no gradient at all.
    assert not np.any(np.asarray(grads_c[0])[mask == 0])


def _float_shapes(hlo: str) -> set[tuple[int, ...]]:
    return {tuple(int(d) for d in dims.split(",") if d)
            for dims in re.findall(r"f32\[([\d,]*)\]", hlo)}


def test_backward_pass_holds_one_chunk_of_logits_at_a_time():
    hidden, embed, targets, mask = inputs()

    def step(h, e):
        return jax.grad(lambda h, e: loss.chunked_loss_sum(h, e, targets, mask, CHUNK),
                        argnums=(0, 1))(h, e)

    shapes = _float_shapes(jax.jit(step).lower(hidden, embed).compile().as_text())
    vocab_sized = {s for s in shapes if VOCAB in s and int(np.prod(s)) > VOCAB * WIDTH}
    assert vocab_sized, "the compiled step has no logits at all: the check would be vacuous"
    assert max(int(np.prod(s)) for s in vocab_sized) <= BATCH * CHUNK * VOCAB, sorted(vocab_sized)
    plain = jax.jit(jax.grad(lambda h, e: loss.loss_sum(h, e, targets, mask), argnums=(0, 1)))
    plain_shapes = _float_shapes(plain.lower(hidden, embed).compile().as_text())
    assert any(int(np.prod(s)) == BATCH * SEQ * VOCAB for s in plain_shapes)
