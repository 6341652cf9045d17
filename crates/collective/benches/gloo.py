#!/usr/bin/env python3
"""torch.distributed gloo all_reduce bus bandwidth on loopback, next to podctl's ring.

Runs one process per rank (torch.multiprocessing, spawn), all-reduces float32 tensors of the given
sizes and reports the bus bandwidth the same way `benches/allreduce.rs` does: algbw x 2(n-1)/n,
where algbw = bytes / (slowest rank's time of one all_reduce), median over iterations, with the
same warm-up and iteration counts. With `--podctl FILE` (the JSON `allreduce.rs --json` writes)
it prints both side by side.

Run it through `run.sh`, which installs the pinned torch into `.venv-bench` first.
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import time

MIB = 1 << 20


def iterations(mib):
    """Warm-up and timed iterations, as in allreduce.rs."""
    if mib <= 4:
        return 5, 40
    if mib <= 32:
        return 2, 10
    if mib <= 128:
        return 1, 5
    return 1, 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, ranks, port, mib, results):
    import torch
    import torch.distributed as dist

    # Two cores are shared by every rank: no intra-op threads on top of gloo's own.
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=ranks,
        timeout=datetime.timedelta(seconds=120),
    )
    tensor = torch.zeros(mib * MIB // 4, dtype=torch.float32)
    warmup, iters = iterations(mib)
    times = []
    for i in range(warmup + iters):
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    results.put((rank, times))
    dist.destroy_process_group()


def measure(ranks, mib):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, ranks, port, mib, results)) for r in range(ranks)]
    for p in procs:
        p.start()
    times = dict(results.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise SystemExit(f"gloo rank process exited with {p.exitcode}")
    slowest = [max(times[r][i] for r in range(ranks)) for i in range(len(times[0]))]
    seconds = statistics.median_low(slowest)
    algbw = mib * MIB / seconds
    return {
        "ranks": ranks,
        "mib": mib,
        "seconds": seconds,
        "algbw_gbps": algbw / 1e9,
        "busbw_gbps": algbw * 2 * (ranks - 1) / ranks / 1e9,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--mib", default="1,16,64,256")
    parser.add_argument("--json", help="also write the gloo results here")
    parser.add_argument("--podctl", help="allreduce.rs --json output to print side by side")
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

    import torch

    print(f"torch {torch.__version__}, gloo all_reduce, float32, loopback")
    rows = []
    for ranks in [int(r) for r in args.ranks.split(",")]:
        for mib in [int(m) for m in args.mib.split(",")]:
            row = measure(ranks, mib)
            rows.append(row)
            print(
                f"  {ranks} ranks {mib:>4} MiB: {row['seconds'] * 1e3:9.2f} ms, "
                f"busbw {row['busbw_gbps']:.2f} GB/s",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=2)
    if args.podctl:
        with open(args.podctl) as f:
            podctl = json.load(f)
        print()
        print(f"raw single-stream TCP loopback: {podctl['raw_tcp_gbps']:.2f} GB/s")
        header = f"{'ranks':>5} {'MiB':>5} {'podctl busbw':>13} {'gloo busbw':>11} {'podctl/gloo':>12} {'podctl/TCP':>11}"
        print(header)
        mine = {(r["ranks"], r["mib"]): r for r in podctl["rows"]}
        for row in rows:
            p = mine.get((row["ranks"], row["mib"]))
            if p is None:
                continue
            print(
                f"{row['ranks']:>5} {row['mib']:>5} {p['busbw_gbps']:>9.2f} GB/s {row['busbw_gbps']:>6.2f} GB/s "
                f"{p['busbw_gbps'] / row['busbw_gbps']:>11.2f}x {100 * p['busbw_gbps'] / p['raw_tcp_gbps']:>10.0f}%"
            )


if __name__ == "__main__":
    main()
