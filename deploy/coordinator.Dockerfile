# The coordinator image: `podctl-coordinator`, one Raft replica of the chart's StatefulSet (its
# controller creates the worker pods). Build from the repository root:
#   docker build -f deploy/coordinator.Dockerfile -t REGISTRY/podctl-coordinator:TAG .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p podctl-coordinator --bin podctl-coordinator

# glibc, CA certificates (GCS over TLS) and the chart's non-root user 65532, nothing else.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/podctl-coordinator /usr/local/bin/podctl-coordinator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/podctl-coordinator"]
