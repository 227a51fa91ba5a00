#!/usr/bin/env bash
# Demo of the agent on the bundled example cluster: print the ruleset (no privileges needed),
# then, as root, check it with nft, apply it, show it and clean it up in a throwaway netns so the
# host's own firewall is never touched.
#
#   bash scripts/demo.sh                 # debug build, examples/cluster, node worker-1
#   PROFILE=release NODE=worker-2 bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

MANIFESTS=${MANIFESTS:-examples/cluster}
NODE=${NODE:-worker-1}
PROFILE=${PROFILE:-debug}

step() { printf '\n==> %s\n' "$*"; }

step "build agent ($PROFILE)"
if [ "$PROFILE" = release ]; then
    cargo build --release --bin agent
else
    cargo build --bin agent
fi
AGENT="$(pwd)/${CARGO_TARGET_DIR:-target}/$PROFILE/agent"
ARGS=(--manifests "$MANIFESTS" --node-name "$NODE")

step "agent --dry-run ${ARGS[*]}"
ruleset=$(mktemp)
ns=""
cleanup() {
    rm -f "$ruleset" "$ruleset.applied"
    if [ -n "$ns" ]; then ip netns delete "$ns" 2>/dev/null || true; fi
}
trap cleanup EXIT
"$AGENT" --dry-run "${ARGS[@]}" | tee "$ruleset"

if [ "$(id -u)" -ne 0 ]; then
    step "not root: stopping here (run as root to apply the ruleset in a throwaway netns)"
    exit 0
fi

ns="nodeplane-demo-$$"
step "throwaway network namespace $ns"
ip netns add "$ns"
ip -n "$ns" link set lo up
in_ns() { ip netns exec "$ns" "$@"; }

step "nft -c -f - (kernel accepts the dry-run output)"
in_ns nft -c -f - <"$ruleset"
echo "ok"

step "agent --once ${ARGS[*]}"
in_ns "$AGENT" --once "${ARGS[@]}"

step "nft list table inet nodeplane"
in_ns nft list table inet nodeplane | tee "$ruleset.applied"

step "agent --once again: nothing changes"
in_ns "$AGENT" --once "${ARGS[@]}"
if ! in_ns nft list table inet nodeplane | diff -u "$ruleset.applied" -; then
    echo "error: a second apply changed the table" >&2
    exit 1
fi
echo "identical"

step "agent cleanup"
in_ns "$AGENT" cleanup --node-name "$NODE"
if in_ns nft list table inet nodeplane >/dev/null 2>&1; then
    echo "error: table inet nodeplane still present after cleanup" >&2
    exit 1
fi
echo "table inet nodeplane removed"
