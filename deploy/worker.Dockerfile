# The worker image: `podctl` (the pods the coordinator creates run `podctl worker`) and libtpu
# from PyPI, the PJRT plugin of TPU hosts. No Python at run time: the bundle was exported on the
# laptop and comes from the checkpoint bucket. Build from the repository root:
#   docker build -f deploy/worker.Dockerfile -t REGISTRY/podctl-worker:TAG .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p podctl --bin podctl

FROM python:3.11-slim-bookworm AS libtpu
# The pin of models/requirements.lock (crates/controller's deploy test checks they agree).
RUN pip install --no-cache-dir --no-deps --target /opt/pip libtpu==0.0.42.1

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/podctl /usr/local/bin/podctl
COPY --from=libtpu /opt/pip/libtpu /opt/libtpu
# `podctl worker` loads this plugin; fetched bundles are cached here.
ENV PODCTL_PJRT_PLUGIN=/opt/libtpu/libtpu.so \
    PODCTL_CACHE=/var/cache/podctl
ENTRYPOINT ["/usr/local/bin/podctl"]
