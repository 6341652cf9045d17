"""JAX's side of the Rust tests and benches: runs a bundle's own `.jaxexport` programs.

    python -m podctl_models.reference run --bundle DIR --program NAME --inputs IN --outputs OUT
    python -m podctl_models.reference bench --bundle DIR --steps N --accum A [--client C]

`run` reads `IN/<i>.bin` (raw little-endian global arrays, in the program's input order) and
writes `OUT/<i>.bin` the same way; it runs any program of any bundle kind (SFT's four, GRPO's
`rollout`, `logprobs`, `grpo_grad_step` and the shared ones). `bench` times the SFT loop.
Both commands run on as many CPU devices as the bundle's mesh has
(`--xla_force_host_platform_device_count`), with the manifest's shardings, device `d` at the
row-major position `d` of the mesh. Exit status 2 means bad arguments or inputs.

`bench --client` picks the XLA CPU client JAX runs on (see `CLIENTS`): jaxlib's own (its
compiler defaults hand dots to YNNPACK), jaxlib's with YNNPACK's fusions off (the compiler
settings of the `xla_cpu_pjrt` plugin build podctl loads), or that plugin itself.
"""

from __future__ import annotations

import os

os.environ["JAX_PLATFORMS"] = "cpu"

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class ReferenceError(Exception):
    """Bad arguments, bundle or inputs; the message names the file or field and the fix."""


@dataclass
class Bundle:
    path: Path
    manifest: dict

    @property
    def mesh_names(self) -> tuple[str, ...]:
        return tuple(axis["name"] for axis in self.manifest["mesh"])

    @property
    def mesh_sizes(self) -> tuple[int, ...]:
        return tuple(axis["size"] for axis in self.manifest["mesh"])

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh_sizes)

    def program(self, name: str) -> dict:
        programs = self.manifest["programs"]
        if name not in programs:
            raise ReferenceError(
                f"program = {name!r} is not in {self.path}/manifest.json; it has "
                f"{', '.join(programs)}")
        return programs[name]


def load_bundle(path: Path) -> Bundle:
    manifest_path = path / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise ReferenceError(f"bundle = {path}: no manifest.json; export a bundle there first") \
            from None
    except json.JSONDecodeError as err:
        raise ReferenceError(f"bundle = {path}: manifest.json is not JSON ({err})") from None
    if manifest.get("format") != "podctl-bundle/1":
        raise ReferenceError(
            f"bundle = {path}: format {manifest.get('format')!r} is not 'podctl-bundle/1'")
    if manifest.get("platform") != "cpu":
        raise ReferenceError(
            f"bundle = {path}: platform {manifest.get('platform')!r} cannot run here; the "
            f"reference runs bundles exported with --platform cpu")
    return Bundle(path, manifest)


# `bench --client` choices: what JAX compiles and runs the programs with.
CLIENTS = {
    "jaxlib": "jaxlib's CPU client, its default compiler settings",
    "jaxlib-no-ynn": "jaxlib's CPU client, XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=",
    "plugin": "the xla_cpu_pjrt plugin podctl loads (PODCTL_PJRT_PLUGIN or .venv's), through "
              "jax's plugin registry",
}
NO_YNN_FLAG = "--xla_cpu_experimental_ynn_fusion_type="


def select_client(client: str, count: int) -> None:
    """Points JAX at `client` (one of `CLIENTS`) with `count` devices; before JAX starts."""
    if client not in CLIENTS:
        raise ReferenceError(f"client = {client!r}: choose one of {', '.join(CLIENTS)}")
    if client == "jaxlib-no-ynn":
        os.environ["XLA_FLAGS"] = " ".join(os.environ.get("XLA_FLAGS", "").split() + [NO_YNN_FLAG])
    if client != "plugin":
        return
    default = Path(__file__).resolve().parents[2] / \
        ".venv/lib/python3/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"
    library = Path(os.environ.get("PODCTL_PJRT_PLUGIN", default))
    if not library.exists():
        raise ReferenceError(f"client = plugin: {library} does not exist; set PODCTL_PJRT_PLUGIN")
    os.environ["JAX_PLATFORMS"] = "xla_cpu_pjrt"  # read when jax is first imported, below
    from jax._src import xla_bridge

    xla_bridge.register_plugin("xla_cpu_pjrt", library_path=str(library),
                               options={"cpu_device_count": count})


def init_devices(count: int) -> None:
    """Makes JAX's CPU backend expose `count` devices; must run before the backend starts."""
    flag = f"--xla_force_host_platform_device_count={count}"
    os.environ["XLA_FLAGS"] = " ".join(
        [f for f in os.environ.get("XLA_FLAGS", "").split()
         if not f.startswith("--xla_force_host_platform_device_count")] + [flag])
    import jax

    if len(jax.devices()) < count:
        raise ReferenceError(
            f"JAX already started with {len(jax.devices())} CPU devices but the bundle's mesh "
            f"needs {count}; run the reference in a fresh process")


class Runner:
    """A bundle's programs, deserialized and jitted on a CPU mesh with the manifest's shardings."""

    def __init__(self, bundle: Bundle):
        import jax
        from jax import export as jax_export
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        self.bundle = bundle
        devices = np.array(jax.devices()[:bundle.num_devices]).reshape(bundle.mesh_sizes)
        self.mesh = Mesh(devices, bundle.mesh_names)
        self._jax, self._export, self._named, self._spec = jax, jax_export, NamedSharding, P
        self._jitted: dict = {}

    def sharding(self, tensor: dict):
        spec = [tuple(axes) if len(axes) > 1 else (axes[0] if axes else None)
                for axes in tensor["sharding"]]
        return self._named(self.mesh, self._spec(*spec))

    def program(self, name: str):
        """Program `name` jitted with the manifest's shardings and donations (compiled on its
        first call)."""
        if name not in self._jitted:
            entry = self.bundle.program(name)
            blob = (self.bundle.path / entry["jax_file"]).read_bytes()
            exported = self._export.deserialize(bytearray(blob))
            jitted = self._jax.jit(
                exported.call,
                in_shardings=tuple(self.sharding(t) for t in entry["inputs"]),
                out_shardings=tuple(self.sharding(t) for t in entry["outputs"]),
                donate_argnums=tuple(i for i, t in enumerate(entry["inputs"]) if t["donated"]))
            self._jitted[name] = jitted
        return self._jitted[name]

    def put(self, array: np.ndarray, tensor: dict):
        return self._jax.device_put(array, self.sharding(tensor))

    def call(self, name: str, *args):
        out = self.program(name)(*args)
        return out if isinstance(out, (tuple, list)) else (out,)


def numpy_dtype(name: str) -> np.dtype:
    """NumPy's dtype for a manifest dtype name (bfloat16 comes from ml_dtypes)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def read_input(path: Path, tensor: dict) -> np.ndarray:
    dtype = numpy_dtype(tensor["dtype"]).newbyteorder("<")
    shape = tuple(tensor["shape"])
    expected = math.prod(shape) * dtype.itemsize
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ReferenceError(
            f"input {tensor['name']}: {path} is missing; write the global array there") from None
    if size != expected:
        raise ReferenceError(
            f"input {tensor['name']}: {path} has {size} bytes but {tensor['dtype']}{list(shape)} "
            f"needs {expected}")
    return np.fromfile(path, dtype=dtype).reshape(shape)


def run(bundle_dir: Path, program: str, inputs: Path, outputs: Path) -> None:
    bundle = load_bundle(bundle_dir)
    entry = bundle.program(program)
    arrays = [read_input(inputs / f"{i}.bin", t) for i, t in enumerate(entry["inputs"])]
    init_devices(bundle.num_devices)
    runner = Runner(bundle)
    args = [runner.put(a, t) for a, t in zip(arrays, entry["inputs"])]
    results = runner.call(program, *args)
    outputs.mkdir(parents=True, exist_ok=True)
    for i, (value, tensor) in enumerate(zip(results, entry["outputs"])):
        host = np.asarray(value).astype(numpy_dtype(tensor["dtype"]).newbyteorder("<"))
        host.tofile(outputs / f"{i}.bin")


def fixed_batch(bundle: Bundle) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A deterministic batch: random non-special tokens, next-token targets, all counted."""
    train, vocab = bundle.manifest["train"], bundle.manifest["model"]["vocab_size"]
    shape = (train["micro_batch"], train["seq_len"])
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, vocab, size=shape, dtype=np.int32)
    targets = np.roll(tokens, -1, axis=1)
    return tokens, targets, np.ones(shape, np.float32)


def bench(bundle_dir: Path, steps: int, accum: int, warmup: int = 2, client: str = "jaxlib") -> dict:
    """JAX's own loop over the bundle's programs on `client` (see `CLIENTS`): init, zero_grads
    once, then per step `accum` grad_steps and one apply_step (which hands back zeroed
    gradients), buffers donated and kept on device, each step awaited. Returns the mean wall
    time of the steps after `warmup`."""
    if steps <= 0 or accum <= 0:
        raise ReferenceError(f"steps = {steps}, accum = {accum}: both must be >= 1")
    bundle = load_bundle(bundle_dir)
    kind = bundle.manifest["train"]["kind"]
    if kind != "sft":
        raise ReferenceError(
            f"bundle = {bundle_dir}: train.kind is {kind!r}; bench times the sft loop "
            f"(grad_step + apply_step), export the bundle with --kind sft")
    select_client(client, bundle.num_devices)
    if client == "plugin":
        import jax

        if len(jax.devices()) < bundle.num_devices:
            raise ReferenceError(f"the plugin has {len(jax.devices())} devices, the bundle needs "
                                 f"{bundle.num_devices}")
    else:
        init_devices(bundle.num_devices)
    runner = Runner(bundle)
    params_n = len(bundle.manifest["params"])
    seed_spec = bundle.program("init")["inputs"][0]
    state = runner.call("init", runner.put(np.uint32(0), seed_spec))
    params, mu, nu = (list(state[i * params_n:(i + 1) * params_n]) for i in range(3))
    grads = list(runner.call("zero_grads"))
    grad_inputs = bundle.program("grad_step")["inputs"]
    batch = [runner.put(a, t) for a, t in zip(fixed_batch(bundle), grad_inputs[2 * params_n:])]
    apply_inputs = bundle.program("apply_step")["inputs"]
    # Every target counts in the fixed batch, so 1 / (tokens per step) is the mean-loss scale.
    tokens = bundle.manifest["train"]["micro_batch"] * bundle.manifest["train"]["seq_len"]
    scale = np.float32(1.0 / (tokens * accum))
    timings = []
    for step in range(1, warmup + steps + 1):
        start = time.perf_counter()
        for _ in range(accum):
            out = runner.call("grad_step", *params, *grads, *batch)
            grads = list(out[:params_n])
        scalars = [runner.put(np.int32(step), apply_inputs[-3]),
                   runner.put(np.float32(1e-3), apply_inputs[-2]),
                   runner.put(scale, apply_inputs[-1])]
        out = runner.call("apply_step", *params, *mu, *nu, *grads, *scalars)
        params, mu, nu, grads = (list(out[i * params_n:(i + 1) * params_n]) for i in range(4))
        out[-1].block_until_ready()
        timings.append(time.perf_counter() - start)
    measured = timings[warmup:]
    return {"step_ms": 1000.0 * sum(measured) / len(measured), "steps": len(measured),
            "client": client}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m podctl_models.reference",
                                     description="Run a bundle's programs with JAX on CPU.")
    commands = parser.add_subparsers(dest="command", required=True)
    run_cmd = commands.add_parser("run", help="run one program on inputs from files")
    run_cmd.add_argument("--bundle", required=True, type=Path)
    run_cmd.add_argument("--program", required=True)
    run_cmd.add_argument("--inputs", required=True, type=Path)
    run_cmd.add_argument("--outputs", required=True, type=Path)
    bench_cmd = commands.add_parser("bench", help="time JAX's own train loop")
    bench_cmd.add_argument("--bundle", required=True, type=Path)
    bench_cmd.add_argument("--steps", type=int, default=10)
    bench_cmd.add_argument("--accum", type=int, default=1)
    bench_cmd.add_argument("--client", default="jaxlib", choices=list(CLIENTS),
                           help="; ".join(f"{k}: {v}" for k, v in CLIENTS.items()))
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            run(args.bundle, args.program, args.inputs, args.outputs)
        else:
            print(json.dumps(bench(args.bundle, args.steps, args.accum, client=args.client)))
    except ReferenceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
