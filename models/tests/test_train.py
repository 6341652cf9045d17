"""Sanity: the tiny model's programs, chained as the worker chains them, fit a fixed batch."""

import jax
import jax.numpy as jnp
import numpy as np

from podctl_models.config import OptimizerConfig, TrainConfig, preset
from podctl_models.programs import build_programs

from conftest import arithmetic_batch, tiny_init


def test_tiny_model_drives_the_loss_down_on_a_fixed_batch():
    train = TrainConfig(micro_batch=8, seq_len=32, loss_chunk=16)
    programs = build_programs(preset("tiny"), train, OptimizerConfig())
    n = len(programs["zero_grads"].outputs)
    grad_step = jax.jit(programs["grad_step"].fn, donate_argnums=tuple(range(n, 2 * n)))
    apply_step = jax.jit(programs["apply_step"].fn, donate_argnums=tuple(range(4 * n)))
    state = tiny_init(jnp.uint32(0))
    params, mu, nu = state[:n], state[n:2 * n], state[2 * n:]
    grads = jax.jit(programs["zero_grads"].fn)()
    tokens, targets, mask = arithmetic_batch(8, 32, seed=0)
    losses = []
    for step in range(1, 41):
        out = grad_step(*params, *grads, tokens, targets, mask)
        grads, loss_sum, count = out[:n], out[n], out[n + 1]
        losses.append(float(loss_sum / count))
        out = apply_step(*params, *mu, *nu, *grads, jnp.int32(step), jnp.float32(1e-2),
                         1.0 / count)
        params, mu, nu, grads = out[:n], out[n:2 * n], out[2 * n:3 * n], out[3 * n:4 * n]
        assert np.isfinite(float(out[-1]))
    assert losses[0] > 3.0, losses[0]  # ~log(128) at init: nothing is learned before step 1
    assert losses[-1] < 0.25 * losses[0], losses
    assert not any(np.any(np.asarray(g)) for g in grads), "apply_step must hand back zeros"
