# syntax=docker/dockerfile:1
#
# vipd container image: a static (musl) binary on an empty base image.
#
#   docker build -t vipd:dev .
#   vipd manifest pod --image vipd:dev ... > /etc/kubernetes/manifests/vipd.yaml
#
# Choices (see docs/operators.md, "Container image"):
# - Static musl binary, `FROM scratch` runtime: no shell, no package manager. The only
#   other files are `nft` and the libraries it links (for the ARP flux guard); vipd reads
#   no files from the image (TLS roots come from the kubeconfig / ServiceAccount CA, which
#   is how kube-rs verifies the API server).
# - Runs as UID 0 but only with NET_ADMIN + NET_RAW: the generated Pod adds exactly these
#   two capabilities, drops ALL, forbids privilege escalation and mounts the root file
#   system read-only. A non-root UID would not work: Kubernetes gives added capabilities
#   to non-root containers only through file capabilities, which allowPrivilegeEscalation:
#   false (no_new_privs) disables, and the kubeconfig it reads on control-plane nodes
#   (admin.conf, k3s.yaml) is readable by root only.
# - No HEALTHCHECK: Kubernetes probes /healthz and /readyz on the admin port (2112).

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-alpine AS build
# ring and the netlink crates need a C toolchain for musl.
RUN apk add --no-cache musl-dev
WORKDIR /src
# Dependencies first, for layer caching: a dummy build of the workspace manifests.
COPY Cargo.toml Cargo.lock ./
COPY .cargo ./.cargo
COPY xtask/Cargo.toml xtask/Cargo.toml
RUN mkdir -p src xtask/src \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && echo 'fn main() {}' > xtask/src/main.rs && touch xtask/src/lib.rs \
    && cargo build --release --locked --bin vipd \
    && rm -rf src xtask/src
COPY src ./src
COPY xtask/src ./xtask/src
# touch: make cargo rebuild the real sources over the dummy ones.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin vipd \
    && cp target/release/vipd /vipd \
    && if ldd /vipd 2>&1 | grep -q '=>'; then echo "vipd is not static" >&2; exit 1; fi \
    && /vipd --version

# nft (nftables) for the ARP flux guard (vipd's `table arp vipd`, docs/operators.md "ARP
# flux"): Alpine's musl build with exactly the shared libraries and loader it links,
# copied into the empty runtime image and checked there with chroot. Without it vipd still
# runs and logs that ARP flux protection is off.
FROM docker.io/library/alpine:3.22 AS nft
RUN apk add --no-cache nftables \
    && for f in /usr/sbin/nft $(ldd /usr/sbin/nft | awk '$2 == "=>" { print $3 } $1 ~ /^\/lib\/ld-musl/ { print $1 }'); do \
         mkdir -p "/out$(dirname "$f")" && cp -L "$f" "/out$f"; \
       done \
    && chroot /out /usr/sbin/nft --version

FROM scratch
COPY --from=build /vipd /vipd
COPY --from=nft /out/ /
# vipd runs `nft` from PATH.
ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin
USER 0:0
ENTRYPOINT ["/vipd"]
CMD ["manager"]
