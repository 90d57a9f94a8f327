# syntax=docker/dockerfile:1
#
# bouncer container image: a statically linked binary on distroless, running as non-root.
#
#   docker build -t bouncer:0.1.0 .
#   docker run --rm bouncer:0.1.0 --help
#
# The builder compiles for x86_64-unknown-linux-gnu with `-C target-feature=+crt-static`, which
# links glibc statically (a static-pie executable; no musl target needed). Because `--target` is
# given, RUSTFLAGS apply only to the target binary, not to build scripts and proc-macros, which must
# stay dynamic. TLS is rustls (ring), so there is no OpenSSL to link. The build fails if the binary
# still needs a dynamic library. The runtime image has no shell, libc or package manager, and runs
# as uid/gid 65532, matching the Helm chart's securityContext (runAsNonRoot, read-only root fs).
#
# Build context: see .dockerignore (only the Cargo manifests, the lock file, src/ and tests/ are
# sent). Needs BuildKit for the cache mounts (the default builder of current Docker releases).

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${RUST_IMAGE} AS builder
ARG TARGET=x86_64-unknown-linux-gnu
# The build context has no .git: `bouncer version` shows this commit (and this date, when set).
ARG BUILD_GIT_COMMIT=
ARG SOURCE_DATE_EPOCH=
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eux; \
    rustup target add "${TARGET}"; \
    RUSTFLAGS="-C target-feature=+crt-static" \
      cargo build --release --locked --target "${TARGET}" --bin bouncer; \
    bin="target/${TARGET}/release/bouncer"; \
    if readelf -d "$bin" | grep -q NEEDED; then \
      echo "error: $bin is dynamically linked:" >&2; readelf -d "$bin" >&2; exit 1; \
    fi; \
    install -D -m 0755 "$bin" /out/bouncer

FROM ${RUNTIME_IMAGE}
COPY --from=builder /out/bouncer /bouncer
USER 65532:65532
ENTRYPOINT ["/bouncer"]
CMD ["--help"]
