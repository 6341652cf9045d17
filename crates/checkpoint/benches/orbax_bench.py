"""Orbax baseline for crates/checkpoint/benches/save_restore.rs.

Saves and restores the same arrays (names, shapes, float32) with orbax-checkpoint's
StandardCheckpointer on CPU JAX, and prints one JSON line with the timings. Run by the Rust
benchmark, which passes the array list as a JSON file:

    python orbax_bench.py --arrays arrays.json --dir /tmp/orbax-ckpt
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402


def evict(path: str) -> int | None:
    """Drops the checkpoint's files from the page cache exactly as the Rust side does to its own:
    sync, then posix_fadvise(POSIX_FADV_DONTNEED) on every file. Returns the bytes still resident
    as fincore counts them (None without fincore)."""
    os.sync()
    files = [os.path.join(d, f) for d, _, names in os.walk(path) for f in names]
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    try:
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--output", "RES", *files],
            check=True, capture_output=True, text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum(int(v) for v in out.split())


def vm_hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arrays", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()

    with open(args.arrays) as f:
        spec = json.load(f)
    rng = np.random.default_rng(0)
    state = {}
    total = 0
    for a in spec:
        host = rng.standard_normal(a["shape"], dtype=np.float32) if a["shape"] else np.float32(1.0)
        state[a["name"].replace("/", ".")] = jax.device_put(host)
        total += host.nbytes
    jax.block_until_ready(state)

    path = os.path.abspath(os.path.join(args.dir, "orbax"))
    shutil.rmtree(path, ignore_errors=True)
    checkpointer = ocp.StandardCheckpointer()
    start = time.perf_counter()
    checkpointer.save(path, state)
    stall = time.perf_counter() - start
    checkpointer.wait_until_finished()
    save_s = time.perf_counter() - start

    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    del state
    resident = evict(path)
    start = time.perf_counter()
    restored = checkpointer.restore(path, abstract)
    jax.block_until_ready(restored)
    restore_s = time.perf_counter() - start
    del restored
    start = time.perf_counter()
    restored = checkpointer.restore(path, abstract)
    jax.block_until_ready(restored)
    restore_warm_s = time.perf_counter() - start
    checkpointer.close()
    shutil.rmtree(path, ignore_errors=True)
    print(
        json.dumps(
            {
                "bytes": total,
                "arrays": len(spec),
                "save_s": save_s,
                "save_stall_s": stall,
                "restore_s": restore_s,
                "resident_bytes": resident,
                "restore_warm_s": restore_warm_s,
                "vm_hwm_kib": vm_hwm_kib(),
                "orbax": ocp.__version__,
                "jax": jax.__version__,
            }
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
