# The coordinator image: `podctl-coordinator`, one Raft replica of the chart's StatefulSet (its
# controller creates the worker pods). GKE's nodes are x86-64; build from the repository root:
#   docker buildx build --platform linux/amd64 -f deploy/coordinator.Dockerfile -t REGISTRY/podctl-coordinator:TAG .
# Base images are pinned by digest (deploy/pin-base-images.sh moves the pins to what the tags
# name today).
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p podctl-coordinator --bin podctl-coordinator

# glibc, CA certificates (GCS over TLS) and the chart's non-root user 65532, nothing else.
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=build /src/target/release/podctl-coordinator /usr/local/bin/podctl-coordinator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/podctl-coordinator"]
