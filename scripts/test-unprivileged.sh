#!/usr/bin/env bash
# The test suite without real root: every test runs as root of a new user namespace that owns
# a new network namespace (`unshare --user --map-root-user --net --mount`), with a private
# tmpfs on /run so `ip netns add` can create /run/netns there. What the kernel does not allow
# in such a namespace fails with its reason; nothing is skipped. CI runs scripts/test.sh as
# real root instead. Arguments go to `cargo test` (e.g. `--test kernel_nft`).
set -euo pipefail
cd "$(dirname "$0")/.."

# Build first, outside: the new network namespace has no route to the crate registry.
cargo test --all-targets --no-run "$@"
exec unshare --user --map-root-user --net --mount --propagation private \
    sh -c 'mount -t tmpfs tmpfs /run && exec cargo test --offline --all-targets "$@"' sh "$@"
