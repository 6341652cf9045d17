"""Shared fixtures. JAX runs on 4 CPU devices so sharded programs run in-process."""

import os

os.environ["JAX_PLATFORMS"] = "cpu"
# Tests compile dozens of small programs and run each a few times: LLVM's optimizations cost
# more than they save here (same results, about 2.5x less compile time). Subprocesses inherit it.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]).strip()

import jax

jax.config.update("jax_num_cpu_devices", 4)

from pathlib import Path

import numpy as np
import pytest

from podctl_models.config import MeshConfig, OptimizerConfig, TrainConfig, preset
from podctl_models.export import BundleConfig, write_bundle
from podctl_models.programs import build_programs

MESH_2X2 = MeshConfig((("fsdp", 2), ("tp", 2)))

# The tiny model's init does not depend on the train shape: one compile serves every test.
tiny_init = jax.jit(build_programs(preset("tiny"), TrainConfig(), OptimizerConfig())["init"].fn)


def tiny_bundle_config(mesh: MeshConfig = MeshConfig(), **train) -> BundleConfig:
    return BundleConfig(preset("tiny"), TrainConfig(**train), mesh=mesh)


@pytest.fixture(scope="session")
def bundle_single(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle_single")
    write_bundle(tiny_bundle_config(), out)
    return out


@pytest.fixture(scope="session")
def bundle_2x2(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle_2x2")
    write_bundle(tiny_bundle_config(MESH_2X2), out)
    return out


def arithmetic_batch(rows: int, seq_len: int, seed: int):
    """SFT rows `BOS a+b=#### c EOS PAD...`: tokens, next-token targets, mask on the answer."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((rows, seq_len), np.int32)
    mask = np.zeros((rows, seq_len), np.float32)
    for r in range(rows):
        a, b = rng.integers(0, 100, size=2)
        prompt = [1] + [ord(c) for c in f"{a}+{b}="]
        answer = [ord(c) for c in f"#### {a + b}"] + [2]
        row = prompt + answer
        tokens[r, :len(row)] = row
        # Position i predicts token i+1: count the predictions of the answer tokens.
        mask[r, len(prompt) - 1:len(row) - 1] = 1.0
    targets = np.concatenate([tokens[:, 1:], np.zeros((rows, 1), np.int32)], axis=1)
    return tokens, targets, mask


def assert_close_to_scale(got, want, tolerance: float) -> None:
    """Every element within `tolerance` times the largest magnitude of `want`: float32 sums in a
    different order differ by rounding relative to the whole array, not to each element."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-30)
    error = float(np.max(np.abs(got - want)))
    assert error <= tolerance * scale, f"max error {error:.3g} > {tolerance:g} x scale {scale:.3g}"
