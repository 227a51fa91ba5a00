#!/usr/bin/env bash
# CI entry point: system packages, toolchain, formatting, lints, then every test tier (unit,
# golden, kernel). Kernel tests need root and network namespaces; this script fails instead of
# letting them be skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "privileges"
if [ "$(id -u)" -ne 0 ]; then
    echo "error: the kernel tests create network namespaces and nftables rules and need root." >&2
    echo "       run: sudo bash scripts/test.sh" >&2
    exit 1
fi

step "system packages"
bash scripts/setup.sh

step "rust toolchain"
if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null; then
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done
cargo --version

step "kernel test prerequisites"
probe="np-ci-probe-$$"
if ! ip netns add "$probe"; then
    echo "error: cannot create a network namespace (ip netns add); kernel tests cannot run." >&2
    exit 1
fi
trap 'ip netns delete "$probe" 2>/dev/null || true' EXIT
ip netns exec "$probe" nft add table inet probe \
    || { echo "error: nftables unusable in a network namespace." >&2; exit 1; }
ip netns delete "$probe"
trap - EXIT
echo "netns + nftables OK (kernel $(uname -r))"

# Line tables are enough for backtraces and make the debug build and its links much smaller.
export CARGO_PROFILE_DEV_DEBUG=line-tables-only CARGO_PROFILE_TEST_DEBUG=line-tables-only
export CARGO_INCREMENTAL=0 CARGO_TERM_COLOR=always RUST_BACKTRACE=1

step "cargo fmt --all -- --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "cargo test --all-targets (unit, golden, kernel)"
# Kernel tests mostly wait for packets and agents: three at a time on two cores took
# kernel_dataplane from 691 s to 570 s on a loaded machine. Set RUST_TEST_THREADS to change it.
RUST_TEST_THREADS="${RUST_TEST_THREADS:-3}" cargo test --all-targets

step "cargo test --doc"
cargo test --doc

step "all green"
