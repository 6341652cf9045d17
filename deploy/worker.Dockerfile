# The worker image: `podctl` from the same wheel a laptop installs (scripts/build-wheel.sh; the
# pods the coordinator creates run `podctl worker`) and libtpu from PyPI, the PJRT plugin of TPU
# hosts. The wheel goes in without its dependencies: they are the exporter's (JAX), and a worker
# runs no Python: the bundle was exported on the laptop and comes from the checkpoint bucket.
# GKE's TPU VMs are x86-64; build from the repository root:
#   docker buildx build --platform linux/amd64 -f deploy/worker.Dockerfile -t REGISTRY/podctl-worker:TAG .
# Base images are pinned by digest (deploy/pin-base-images.sh moves the pins to what the tags
# name today), maturin by version (scripts/build-wheel.sh), libtpu by version and wheel hash
# (deploy/worker-libtpu.txt).
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN scripts/build-wheel.sh --out /wheels

FROM python:3.11-slim-bookworm@sha256:528257d48c1da0dcecc2e725d1ae34498d60c965f1241e39cd6a85a8859bdf84 AS libtpu
COPY deploy/worker-libtpu.txt /tmp/worker-libtpu.txt
RUN pip install --no-cache-dir --no-deps --require-hashes --target /opt/pip -r /tmp/worker-libtpu.txt

# The worker runs as root: libtpu opens the TPU's device nodes (/dev/vfio/* on v5e and v6e),
# which the host creates owned by root, and a container runtime hands them over with the host's
# ownership unless it is set to give them the pod's user; XPK runs TPU containers as root,
# privileged. podctl asks for nothing beyond root: the pods the controller makes set
# allowPrivilegeEscalation: false and need no privileged mode on GKE 1.28 or later.
FROM python:3.11-slim-bookworm@sha256:528257d48c1da0dcecc2e725d1ae34498d60c965f1241e39cd6a85a8859bdf84
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-deps /tmp/wheels/podctl-*.whl && rm -rf /tmp/wheels
COPY --from=libtpu /opt/pip/libtpu /opt/libtpu
# `podctl worker` loads this plugin; fetched bundles are cached here.
ENV PODCTL_PJRT_PLUGIN=/opt/libtpu/libtpu.so \
    PODCTL_CACHE=/var/cache/podctl
ENTRYPOINT ["/usr/local/bin/podctl"]
