"""AdamW with global-norm clipping, as one pure function over parameter dicts.

Matches `optax.chain(optax.clip_by_global_norm(c), optax.adamw(lr, b1, b2, eps, weight_decay=wd,
mask=...))`, except that the step count and learning rate are inputs: the host owns the schedule
and the step, so a restored or resharded run continues exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .config import OptimizerConfig

Tree = dict[str, jax.Array]


def global_norm(tree: Tree) -> jax.Array:
    """sqrt of the sum of squares of every element, in float32."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in tree.values()))


def adamw_apply(params: Tree, mu: Tree, nu: Tree, grads: Tree, step: jax.Array,
                learning_rate: jax.Array, grad_scale: jax.Array, decay: dict[str, bool],
                opt: OptimizerConfig, fetch=None, store=None):
    """One AdamW step. Returns `(params, mu, nu, grad_norm)`.

    `grads` are multiplied by `grad_scale` first; `grad_norm` is their global norm before
    clipping to `opt.max_grad_norm`. `step` is 1-based (bias correction); `decay[path]` says
    whether that parameter gets weight decay.
    """
    f32 = jnp.float32
    scaled = {k: g.astype(f32) * grad_scale for k, g in grads.items()}
    norm = global_norm(scaled)
    # optax.clip_by_global_norm: keep the gradient when under the limit, else rescale it.
    under = norm < opt.max_grad_norm
    clipped = {k: jnp.where(under, g, g / norm * opt.max_grad_norm) for k, g in scaled.items()}
    count = step.astype(f32)
    bias1 = 1.0 - opt.b1 ** count
    bias2 = 1.0 - opt.b2 ** count
    new_params, new_mu, new_nu = {}, {}, {}
    for k, g in clipped.items():
        # Offload: `fetch` brings parameter k's moments to the device, `store` takes the new
        # ones back, one parameter at a time (see programs.OffloadChain).
        old_m, old_v = fetch(k, mu[k], nu[k]) if fetch else (mu[k], nu[k])
        m = (1.0 - opt.b1) * g + opt.b1 * old_m.astype(f32)
        v = (1.0 - opt.b2) * jnp.square(g) + opt.b2 * old_v.astype(f32)
        p = params[k].astype(f32)
        update = (m / bias1) / (jnp.sqrt(v / bias2) + opt.eps)
        if decay[k]:
            update = update + opt.weight_decay * p
        new_params[k] = (p - learning_rate * update).astype(params[k].dtype)
        new_mu[k], new_nu[k] = m.astype(mu[k].dtype), v.astype(nu[k].dtype)
        if store:
            new_mu[k], new_nu[k] = store(k, new_mu[k], new_nu[k])
    return new_params, new_mu, new_nu, norm
