# mpi-webhook container image: one binary, both containers of the pod (`serve`, `reconcile`).
#
#   docker build -t ghcr.io/mpi-webhook/mpi-webhook:0.1.0 .
#
# The build step is `cargo build --release --locked`, the same command .ci/run runs, with the same
# toolchain version. Not buildable on our CI machines (no Docker engine), so it stays short.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /build
# Dependencies first, in their own layer: rebuilt only when Cargo.toml or Cargo.lock change.
# Cargo.toml names the benches, and cargo refuses a manifest whose targets are missing, so they
# come too (they are not built); tests/manifests.rs replays these steps without Docker.
COPY Cargo.toml Cargo.lock ./
COPY benches ./benches
RUN mkdir src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && cargo build --release --locked \
    && rm -rf src
# Then the crate. manifests/runtimes/ is compiled in (offline mode's default runtimes).
COPY src ./src
COPY manifests/runtimes ./manifests/runtimes
# touch: COPY keeps the files' old mtimes, which cargo would take for "older than the stub build".
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked

# glibc (cc) distroless, Debian 12 like the builder; no shell, no package manager; user 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="mpi-webhook" \
      org.opencontainers.image.description="Kubernetes admission webhook and reconciler that give Kubeflow Trainer TrainJobs their MPI wiring" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/mpi-webhook/mpi-webhook" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"
COPY --from=builder /build/target/release/mpi-webhook /usr/local/bin/mpi-webhook
USER 65532:65532
# 9443 webhook (HTTPS), 9090 webhook metrics, 9091 reconciler probes and metrics.
EXPOSE 9443 9090 9091
ENTRYPOINT ["/usr/local/bin/mpi-webhook"]
CMD ["--help"]
