"""AdamW + global-norm clipping against optax."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from podctl_models.config import OptimizerConfig
from podctl_models.optim import adamw_apply

OPT = OptimizerConfig(b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=1.0)
DECAY = {"matrix": True, "stacked_norm": False, "vector": False}


def tree(seed: int, scale: float):
    rng = np.random.default_rng(seed)
    shapes = {"matrix": (2, 8, 6), "stacked_norm": (2, 8), "vector": (5,)}
    return {k: (rng.normal(size=s) * scale).astype(np.float32) for k, s in shapes.items()}


def run_both(grad_scale: float, grad_magnitude: float, steps: int = 4):
    params = tree(0, 1.0)
    optax_opt = optax.chain(
        optax.clip_by_global_norm(OPT.max_grad_norm),
        optax.adamw(learning_rate=1e-2, b1=OPT.b1, b2=OPT.b2, eps=OPT.eps,
                    weight_decay=OPT.weight_decay, mask=DECAY))
    optax_state = optax_opt.init(params)
    optax_params = params
    ours = (params, jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))
    apply = jax.jit(lambda p, m, v, g, step, lr, scale:
                    adamw_apply(p, m, v, g, step, lr, scale, DECAY, OPT))
    norms = []
    for step in range(1, steps + 1):
        raw = tree(step, grad_magnitude)
        scaled = jax.tree.map(lambda g: g * np.float32(grad_scale), raw)
        updates, optax_state = optax_opt.update(scaled, optax_state, optax_params)
        optax_params = optax.apply_updates(optax_params, updates)
        p, m, v, norm = apply(*ours, raw, jnp.int32(step), jnp.float32(1e-2),
                              jnp.float32(grad_scale))
        ours = (p, m, v)
        norms.append((float(norm), float(optax.tree.norm(scaled))))
    return ours[0], optax_params, norms


def test_matches_optax_when_clipping():
    ours, theirs, norms = run_both(grad_scale=0.5, grad_magnitude=3.0)
    assert all(ours_norm > OPT.max_grad_norm for ours_norm, _ in norms)
    for k in ours:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-6, atol=1e-6)
    for ours_norm, optax_norm in norms:
        np.testing.assert_allclose(ours_norm, optax_norm, rtol=1e-6)


def test_matches_optax_without_clipping():
    ours, theirs, norms = run_both(grad_scale=0.25, grad_magnitude=0.1)
    assert all(ours_norm < OPT.max_grad_norm for ours_norm, _ in norms)
    for k in ours:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-6, atol=1e-6)


def test_weight_decay_only_touches_matrices():
    params = tree(0, 1.0)
    zeros = jax.tree.map(jnp.zeros_like, params)
    new, _, _, _ = adamw_apply(params, zeros, zeros, zeros, jnp.int32(1), jnp.float32(0.5),
                               jnp.float32(1.0), DECAY, OPT)
    np.testing.assert_array_equal(new["stacked_norm"], params["stacked_norm"])
    np.testing.assert_array_equal(new["vector"], params["vector"])
    np.testing.assert_allclose(new["matrix"], params["matrix"] * (1 - 0.5 * 0.1), rtol=1e-6)


def test_offload_hooks_do_not_change_a_bit():
    """The offload path fetches and stores each parameter's moments through hooks chained by
    optimization barriers (programs.OffloadChain); the update is bitwise the plain one."""
    params, grads = tree(0, 1.0), tree(1, 2.0)
    mu, nu = tree(2, 0.1), jax.tree.map(np.abs, tree(3, 0.1))
    order = []

    def fetch(k, m, v):
        order.append(("fetch", k))
        return jax.lax.optimization_barrier((m, v))

    def store(k, m, v):
        order.append(("store", k))
        return jax.lax.optimization_barrier((m, v))

    def run(**hooks):
        return jax.jit(lambda p, m, v, g: adamw_apply(p, m, v, g, jnp.int32(3), jnp.float32(1e-2),
                                                      jnp.float32(0.5), DECAY, OPT, **hooks))(
            params, mu, nu, grads)

    plain, hooked = run(), run(fetch=fetch, store=store)
    assert order == [(op, k) for k in params for op in ("fetch", "store")]
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(hooked)):
        np.testing.assert_array_equal(a, b)
