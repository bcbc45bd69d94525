# syntax=docker/dockerfile:1
#
# Container image of pg-storage-exporter: a Rust builder stage, then an
# image from scratch holding only what the binary needs at run time: the
# binary, the four glibc shared objects it links (ldd lists them), the CA
# bundle (for sslrootcert=system), and passwd/group entries for its
# non-root user. No shell, no package manager: nothing in the image that
# the exporter does not run. Build from the repository root, with docker or
# podman:
#
#   docker build -t pg-storage-exporter .
#   podman build -t pg-storage-exporter .
#
# The crates are downloaded from crates.io by `cargo build --locked` during
# the build (versions pinned by Cargo.lock), so the build needs network
# access to crates.io, as well as to the Debian mirror for the runtime stage.
#
# Base images are build arguments, for a registry mirror or local images:
#
#   podman build --build-arg BUILDER_IMAGE=localhost/my-rust -t pg-storage-exporter .
#
# The builder needs Rust 1.85 or later (edition 2024), cargo, a C compiler
# (ring), ldd and a CA bundle at /etc/ssl/certs/ca-certificates.crt, with
# cargo's home in /usr/local/cargo as in the official rust images.
# scripts/container-test builds one from local Debian packages and the
# host's Rust toolchain, then builds, runs and scrapes the image.
#
# Run it on the PostgreSQL host as the owner of the data directory, with
# PostgreSQL's directories mounted at their own paths, so that volume
# discovery can read them and create probe directories beside them
# (docs/install.md, "Container image"; scripts/container-test runs this):
#
#   docker run -d --name pg-storage-exporter --network host \
#     --user "$(stat -c %u:%g /srv/pg/data)" -v /srv/pg:/srv/pg -e PGPASSWORD \
#     pg-storage-exporter --pg.dsn 'main=host=127.0.0.1 port=5432 user=pgse dbname=postgres'
#
# Without arguments it runs --config.file /etc/pg-storage-exporter/config.toml
# (the image has none: mount one, e.g. -v /etc/pg-storage-exporter:/etc/pg-storage-exporter:ro).
# Debugging needs a shell the image does not have: `docker cp` the binary
# out, or run a debug container in the exporter's namespaces.
#
# The image's own user (uid 10001) suits a configuration whose probe
# directories it can write, and in a PostgreSQL pod run it as the PostgreSQL
# uid (see deploy/kubernetes/). Probe directories must be on the volumes
# being measured, bind-mounted from the host: the exporter refuses tmpfs and
# the container's own overlay filesystem would measure the wrong disk.
#
# io_uring and seccomp: podman's default seccomp profile (containers-common)
# hides io_uring_setup (ENOSYS); Docker's (Engine 25.0 and later,
# moby#46762) and containerd's (2.0 and later, containerd#9320, which is
# what Kubernetes' RuntimeDefault uses on containerd nodes) make
# io_uring_setup, io_uring_enter and io_uring_register fail with EPERM, and
# some hosts set kernel.io_uring_disabled. The exporter's default engine
# ("auto") then falls back to plain pwrite/fdatasync/pread syscalls, which
# time exactly the same write + sync and O_DIRECT read, and logs why once;
# the engine in use is the `engine` label of pgstorage_volume_info. Set
# engine = "sync" in the configuration to skip the attempt and its log line.
# Do not loosen the container's seccomp profile for the exporter.
#
# The postgres.syncs collector (PostgreSQL's own syncs timed in the kernel)
# needs CAP_BPF and CAP_PERFMON, the host's PID namespace and tracefs
# (docs/install.md, "Tracing PostgreSQL's syncs"):
#   --cap-add BPF --cap-add PERFMON --pid host -v /sys/kernel/tracing:/sys/kernel/tracing
# Without them it is off, with the reason in the log and in
# pgstorage_pg_sync_tracing; everything else works.

ARG BUILDER_IMAGE=docker.io/library/rust:1.95-bookworm

FROM ${BUILDER_IMAGE} AS builder
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY scripts/image-rootfs /usr/local/bin/image-rootfs
# Cache mounts keep the crate registry and the build directory between
# builds (docker with BuildKit, podman 4 and later); the binary is copied
# out of the cache in the same step, into the run-time tree that
# scripts/image-rootfs assembles (the binary, the glibc objects it links,
# the CA bundle, passwd/group entries).
# The `bpf` feature (the postgres.syncs collector) compiles a BPF program
# with clang against libbpf's headers.
RUN command -v clang >/dev/null && [ -f /usr/include/bpf/bpf_helpers.h ] || { \
      apt-get update && apt-get install -y --no-install-recommends clang libbpf-dev \
      && rm -rf /var/lib/apt/lists/*; }
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --features bpf \
    && image-rootfs target/release/pg-storage-exporter /rootfs

FROM scratch
COPY --from=builder /rootfs/ /
USER 10001:10001
EXPOSE 9847
ENTRYPOINT ["/usr/local/bin/pg-storage-exporter"]
CMD ["--config.file", "/etc/pg-storage-exporter/config.toml"]
