"""Shared fixtures. JAX runs on 4 CPU devices so sharded programs run in-process."""

import dataclasses
import json
import os

os.environ["JAX_PLATFORMS"] = "cpu"
# Tests compile dozens of small programs and run each a few times: LLVM's optimizations cost
# more than they save here (same results, about 2.5x less compile time). Subprocesses inherit it.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]).strip()

import jax
from jax import export as jax_export

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


# GRPO tests: 4 rows of an 8-token prompt buffer and 8 generated tokens, log-probs in 4 chunks.
GRPO_TRAIN = TrainConfig.grpo(prompt_len=8, max_new_tokens=8, logprob_chunk=4, micro_batch=4)


@pytest.fixture(scope="session")
def grpo_bundle_single(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grpo_single")
    write_bundle(BundleConfig(preset("tiny"), GRPO_TRAIN), out)
    return out


@pytest.fixture(scope="session")
def grpo_bundle_2x2(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grpo_2x2")
    write_bundle(BundleConfig(preset("tiny"), GRPO_TRAIN, mesh=MESH_2X2), out)
    return out


@pytest.fixture(scope="session")
def grpo_bundle_grouped(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grpo_grouped")
    write_bundle(BundleConfig(preset("tiny"), dataclasses.replace(GRPO_TRAIN, prompt_group=2)), out)
    return out


class BundlePrograms:
    """A single-device bundle's own modules (its `.jaxexport` files), compiled on first use."""

    def __init__(self, bundle_dir: Path):
        self.dir = bundle_dir
        self.manifest = json.loads((bundle_dir / "manifest.json").read_text())
        self._compiled: dict = {}

    def compiled(self, name: str, *args):
        if name not in self._compiled:
            entry = self.manifest["programs"][name]
            blob = (self.dir / entry["jax_file"]).read_bytes()
            exported = jax_export.deserialize(bytearray(blob))
            self._compiled[name] = jax.jit(exported.call).lower(*args).compile()
        return self._compiled[name]

    def __call__(self, name: str, *args):
        return self.compiled(name, *args)(*args)


@pytest.fixture(scope="session")
def grpo_grouped_programs(grpo_bundle_grouped) -> BundlePrograms:
    return BundlePrograms(grpo_bundle_grouped)


@pytest.fixture(scope="session")
def grpo_programs(grpo_bundle_single) -> BundlePrograms:
    return BundlePrograms(grpo_bundle_single)


def grpo_prompts(seed: int, lengths=(8, 5, 3, 1)):
    """Left-padded prompts `[4, 8]` (PAD = 0 before each row's real tokens) and their lengths."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, np.int32)
    prompts = np.zeros((len(lengths), GRPO_TRAIN.prompt_len), np.int32)
    for row, length in enumerate(lengths):
        prompts[row, GRPO_TRAIN.prompt_len - length:] = rng.integers(3, 128, length)
    return prompts, lengths


def full_sequences(prompts, completions):
    """`[prompt | completion]` rows and their next-token targets (PAD after the last)."""
    tokens = np.concatenate([prompts, completions], axis=1).astype(np.int32)
    targets = np.concatenate([tokens[:, 1:], np.zeros((len(tokens), 1), np.int32)], axis=1)
    return tokens, targets


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
