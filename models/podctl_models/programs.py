"""The four programs of a bundle (docs/BUNDLE.md) as flat-argument functions plus signatures.

Each program takes and returns flat positional arrays in the manifest's order, so the exported
module's arguments are exactly the manifest's inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import optim, qwen3
from .config import ModelConfig, OptimizerConfig, TrainConfig

PROGRAM_NAMES = ("init", "zero_grads", "grad_step", "apply_step")


@dataclass(frozen=True)
class TensorSpec:
    """One argument or result: name, global shape, NumPy dtype name, mesh axis per dimension."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    spec: tuple[str | None, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(jnp.dtype(self.dtype)).itemsize

    def shard_bytes(self, mesh_sizes: dict[str, int]) -> int:
        """Bytes of one device's shard."""
        shards = math.prod(mesh_sizes[axis] for axis in self.spec if axis is not None)
        return self.nbytes // shards

    def manifest(self, donated: bool | None = None) -> dict:
        entry = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                 "sharding": [[] if axis is None else [axis] for axis in self.spec]}
        if donated is not None:
            entry["donated"] = donated
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
                   mesh=None) -> dict[str, Program]:
    """The programs for one (model, train, optimizer) setting.

    `mesh` (a Mesh or AbstractMesh) enables activation sharding constraints; None is for plain
    single-device use.
    """
    specs = qwen3.param_specs(model)
    paths = [s.path for s in specs]
    decay = {s.path: s.decays for s in specs}
    pdtype = train.param_dtype

    def group(prefix):
        return tuple(TensorSpec(f"{prefix}/{s.path}", s.shape, pdtype, s.spec) for s in specs)

    params, mu, nu, grads = group("params"), group("opt/mu"), group("opt/nu"), group("grads")
    batch_shape = (train.micro_batch, train.seq_len)
    batch = (TensorSpec("batch/tokens", batch_shape, "int32", ("fsdp", None)),
             TensorSpec("batch/targets", batch_shape, "int32", ("fsdp", None)),
             TensorSpec("batch/loss_mask", batch_shape, "float32", ("fsdp", None)))
    n = len(paths)

    def as_dict(values):
        return dict(zip(paths, values))

    def as_list(tree):
        return [tree[p] for p in paths]

    def init(seed):
        p = qwen3.init_params(model, seed, jnp.dtype(pdtype))
        moments = [jnp.zeros(s.shape, pdtype) for s in specs]
        return (*as_list(p), *moments, *moments)

    def zero_grads():
        return tuple(jnp.zeros(s.shape, pdtype) for s in specs)

    def grad_step(*args):
        p, g = as_dict(args[:n]), as_dict(args[n:2 * n])
        tokens, targets, loss_mask = args[2 * n:]

        def loss_fn(p):
            return qwen3.sft_loss(p, tokens, targets, loss_mask, model, train, mesh)

        (loss_sum, token_count), step_grads = jax.value_and_grad(loss_fn, has_aux=True)(p)
        new_grads = [g[k] + step_grads[k].astype(g[k].dtype) for k in paths]
        return (*new_grads, loss_sum, token_count)

    def apply_step(*args):
        p, m, v, g = (as_dict(args[i * n:(i + 1) * n]) for i in range(4))
        step, learning_rate, grad_scale = args[4 * n:]
        p, m, v, norm = optim.adamw_apply(p, m, v, g, step, learning_rate, grad_scale, decay, opt)
        zeros = [jnp.zeros_like(g[k]) for k in paths]
        return (*as_list(p), *as_list(m), *as_list(v), *zeros, norm)

    return {
        "init": Program("init", init, (_scalar("seed", "uint32"),), params + mu + nu, frozenset()),
        "zero_grads": Program("zero_grads", zero_grads, (), grads, frozenset()),
        "grad_step": Program(
            "grad_step", grad_step, params + grads + batch,
            grads + (_scalar("loss_sum", "float32"), _scalar("token_count", "float32")),
            frozenset(range(n, 2 * n))),
        "apply_step": Program(
            "apply_step", apply_step,
            params + mu + nu + grads + (_scalar("step", "int32"),
                                        _scalar("learning_rate", "float32"),
                                        _scalar("grad_scale", "float32")),
            params + mu + nu + grads + (_scalar("grad_norm", "float32"),),
            frozenset(range(4 * n))),
    }
