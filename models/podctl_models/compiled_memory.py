"""JAX's compiled memory statistics of one program of a bundle, for an accelerator topology.

    python -m podctl_models.compiled_memory BUNDLE [--program grad_step] [--topology v6e:2x4]

Lowers a call of the bundle's `.jaxexport` program with the manifest's shardings and donation
for the topology (libtpu's `v6e:2x4` on a CPU-only machine through `jax.experimental.topologies`),
puts the bundle's own StableHLO module (`programs/<name>.mlirbc`, what podctl compiles) in place
of the lowered one, compiles it with JAX, and prints `compiled.memory_analysis()` per device as
one JSON line, with the device assignment JAX compiled for (partition p on device
`device_assignment[p]`): a compile through podctl's PJRT bindings must use the same assignment
to be compared byte for byte. `--module call` compiles JAX's own lowering of the call instead, a
different module (the exported function wrapped in a call; for a qwen3-1.7b grad step XLA gives
it 425 KB more temp memory). Exit status 2 means bad arguments.
"""

from __future__ import annotations


import podctl_models.tpu_aot_env  # noqa: F401,E402  (before JAX: TPU AOT environment)

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
from jax import export as jax_export
from jax._src.interpreters import mlir
from jax._src.lib import _jax
from jax._src.lib.mlir import ir
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .reference import numpy_dtype


MODULES = ("bundle", "call")


def compile_stats(bundle: Path, program: str, topology_name: str = "v6e:2x4",
                  platform: str = "tpu", module: str = "bundle") -> dict:
    """`memory_analysis()` of the bundle's `program` compiled for `topology_name`, in bytes per
    device, plus `reserved` (argument + output - alias + temp: what the call needs on the
    device at once), `device_assignment` and `compile_s`. `module` is `bundle` (the bundle's
    own StableHLO) or `call` (JAX's lowering of a call of the exported function)."""
    if module not in MODULES:
        raise ValueError(f"module {module!r}: choose one of {', '.join(MODULES)}")
    document = json.loads((bundle / "manifest.json").read_text())
    if program not in document["programs"]:
        raise KeyError(f"program {program!r} is not in {bundle}; the bundle has "
                       f"{', '.join(document['programs'])}")
    entry = document["programs"][program]
    exported = jax_export.deserialize(bytearray((bundle / entry["jax_file"]).read_bytes()))
    topology = topologies.get_topology_desc(topology_name, platform=platform)
    sizes = tuple(axis["size"] for axis in document["mesh"])
    names = tuple(axis["name"] for axis in document["mesh"])
    if int(np.prod(sizes)) != len(topology.devices):
        raise ValueError(f"{bundle} is lowered for mesh {dict(zip(names, sizes))} "
                         f"({int(np.prod(sizes))} devices) but {topology_name} has "
                         f"{len(topology.devices)}; export it for a mesh of that many devices "
                         f"or pick a matching --topology")
    mesh = Mesh(np.array(topology.devices).reshape(sizes), names)

    def sharding(tensor):
        spec = [None if not axes else axes[0] if len(axes) == 1 else tuple(axes)
                for axes in tensor["sharding"]]
        return NamedSharding(mesh, P(*spec), memory_kind=tensor.get("memory_kind"))

    inputs, outputs = entry["inputs"], entry["outputs"]
    jitted = jax.jit(exported.call, in_shardings=tuple(sharding(t) for t in inputs),
                     out_shardings=tuple(sharding(t) for t in outputs),
                     donate_argnums=tuple(i for i, t in enumerate(inputs) if t["donated"]))
    args = [jax.ShapeDtypeStruct(tuple(t["shape"]), numpy_dtype(t["dtype"]), sharding=sharding(t))
            for t in inputs]
    start = time.perf_counter()
    lowered = jitted.lower(*args)
    with mlir.make_ir_context():
        if module == "bundle":
            # JAX keeps the module it lowered in its (private) MeshComputation; compiling goes
            # through it with JAX's compile options and device assignment, so replacing it
            # compiles exactly the bytes podctl compiles. Checked against JAX 0.10.2.
            computation = lowered._lowering
            if not isinstance(getattr(computation, "_hlo", None), ir.Module):
                raise RuntimeError(f"JAX {jax.__version__} keeps its lowered module elsewhere; "
                                   f"use --module call or update compiled_memory.py")
            # The file is a portable artifact (versioned VHLO), as the PJRT plugin receives it.
            artifact = (bundle / entry["file"]).read_bytes()
            computation._hlo = _jax.mlir.deserialize_portable_artifact(artifact)
        stats = lowered.compile().memory_analysis()
    seconds = time.perf_counter() - start
    result = {
        "argument": stats.argument_size_in_bytes,
        "output": stats.output_size_in_bytes,
        "alias": stats.alias_size_in_bytes,
        "temp": stats.temp_size_in_bytes,
        "generated_code": stats.generated_code_size_in_bytes,
        "peak": stats.peak_memory_in_bytes,
        "host_argument": stats.host_argument_size_in_bytes,
        "host_output": stats.host_output_size_in_bytes,
        "host_temp": stats.host_temp_size_in_bytes,
    }
    # XLA reserves the temp allocation whole, next to the arguments and the outputs that do not
    # alias them; its compile-time out-of-memory check is on this sum.
    result["reserved"] = result["argument"] + result["output"] - result["alias"] + result["temp"]
    result["device_assignment"] = [int(d.id) for d in mesh.devices.flat]
    result["compile_s"] = round(seconds, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m podctl_models.compiled_memory",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="bundle directory (with manifest.json)")
    parser.add_argument("--program", default="grad_step")
    parser.add_argument("--topology", default="v6e:2x4")
    parser.add_argument("--module", default="bundle", choices=MODULES,
                        help="bundle: the bundle's own StableHLO; call: JAX's lowering of a call")
    args = parser.parse_args(argv)
    if not (args.bundle / "manifest.json").is_file():
        print(f"error: {args.bundle}/manifest.json does not exist; export a bundle there first "
              f"(python -m podctl_models.export ... --out {args.bundle})", file=sys.stderr)
        return 2
    try:
        stats = compile_stats(args.bundle, args.program, args.topology, module=args.module)
    except (KeyError, ValueError) as err:
        print(f"error: {err.args[0]}", file=sys.stderr)
        return 2
    print(json.dumps({"program": args.program, "topology": args.topology, "module": args.module,
                      **stats}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
