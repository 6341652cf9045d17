# The worker image: `podctl` (the pods the coordinator creates run `podctl worker`) and libtpu
# from PyPI, the PJRT plugin of TPU hosts. No Python at run time: the bundle was exported on the
# laptop and comes from the checkpoint bucket. GKE's TPU VMs are x86-64; build from the
# repository root:
#   docker buildx build --platform linux/amd64 -f deploy/worker.Dockerfile -t REGISTRY/podctl-worker:TAG .
# Base images are pinned by digest (deploy/pin-base-images.sh moves the pins to what the tags
# name today), libtpu by version and wheel hash (deploy/worker-libtpu.txt).
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p podctl --bin podctl

FROM python:3.11-slim-bookworm@sha256:528257d48c1da0dcecc2e725d1ae34498d60c965f1241e39cd6a85a8859bdf84 AS libtpu
COPY deploy/worker-libtpu.txt /tmp/worker-libtpu.txt
RUN pip install --no-cache-dir --no-deps --require-hashes --target /opt/pip -r /tmp/worker-libtpu.txt

# The worker runs as root: libtpu opens the TPU's device nodes (/dev/vfio/* on v5e and v6e),
# which the host creates owned by root, and a container runtime hands them over with the host's
# ownership unless it is set to give them the pod's user; XPK runs TPU containers as root,
# privileged. podctl asks for nothing beyond root: the pods the controller makes set
# allowPrivilegeEscalation: false and need no privileged mode on GKE 1.28 or later.
FROM debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/podctl /usr/local/bin/podctl
COPY --from=libtpu /opt/pip/libtpu /opt/libtpu
# `podctl worker` loads this plugin; fetched bundles are cached here.
ENV PODCTL_PJRT_PLUGIN=/opt/libtpu/libtpu.so \
    PODCTL_CACHE=/var/cache/podctl
ENTRYPOINT ["/usr/local/bin/podctl"]
