# The kyverno-runtime image: the daemon (the default command) and the CLI.
#
#   docker build -t kyverno-runtime:dev .
#
# The chart runs it as `kyverno-runtime daemon` with privileged: true.
# Loading and attaching BPF programs needs CAP_BPF, CAP_PERFMON,
# CAP_SYS_ADMIN and CAP_NET_ADMIN in the host's user namespace, so the daemon
# runs as root; that is why there is no `USER 65532` here: a non-root default
# user would break the default command. `kyverno-runtime collector` and
# `kyverno-runtime policy check` need no privileges; run them with
# `--user 65532:65532` (or runAsNonRoot/runAsUser in a pod spec).

# --- builder: Debian 12, the same distribution as the runtime stage, so the
# binary links against the libelf and glibc it will find there.
FROM rust:1-bookworm AS builder
# pipefail, so that the build log filter below cannot hide a failing cargo.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# clang compiles the CO-RE BPF objects (bpf/build.rs); libbpf-rs links libbpf
# statically and needs libelf, zlib and pkg-config to do so.
RUN apt-get update \
 && apt-get install -y --no-install-recommends clang libelf-dev zlib1g-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Without clang bpf/build.rs builds a stub with no BPF objects and only warns;
# an image like that could enforce nothing, so its warning fails the build.
RUN cargo build --release -p kyverno-runtime --locked 2>&1 | tee /tmp/build.log \
 && ! grep -q 'building WITHOUT BPF objects' /tmp/build.log

# --- runtime: the binary and the two shared libraries it links beyond glibc
# (`ldd`: libelf.so.1, libz.so.1, libgcc_s, libm, libc), and the CA roots
# that `http.get` data sources verify servers with (the client reads the
# system's store; without it every HTTPS source fails, issue 25).
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libelf1 zlib1g ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=builder /src/target/release/kyverno-runtime /usr/local/bin/kyverno-runtime
LABEL org.opencontainers.image.title="kyverno-runtime" \
      org.opencontainers.image.description="Per-node eBPF agent for RuntimePolicy (runtime.nirmata.io/v1alpha1)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/usr/local/bin/kyverno-runtime"]
CMD ["daemon"]
