#!/usr/bin/env bash
# Demo of the agent on the bundled example cluster: print the ruleset (no privileges needed),
# then, as root, check it with nft, apply it, show it and clean it up in a throwaway netns so the
# host's own firewall is never touched; finally show EgressQoS DSCP marking, EgressFirewall
# allow/deny and EgressIP (two nodes on one bridge, the egress IP as the source an external
# host sees) and Services (a ClusterIP and a NodePort answered by several backends) on real packets (pod netns behind node netns, an external host; needs python3).
#
#   bash scripts/demo.sh                 # debug build, examples/cluster, node worker-1
#   PROFILE=release NODE=worker-2 bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

MANIFESTS=${MANIFESTS:-examples/cluster}
NODE=${NODE:-worker-1}
PROFILE=${PROFILE:-debug}

step() { printf '\n==> %s\n' "$*"; }

step "system packages"
bash scripts/setup.sh

step "build agent ($PROFILE)"
if [ "$PROFILE" = release ]; then
    cargo build --release --bin agent
else
    cargo build --bin agent
fi
target_dir=${CARGO_TARGET_DIR:-target}
case "$target_dir" in /*) ;; *) target_dir="$(pwd)/$target_dir" ;; esac
AGENT="$target_dir/$PROFILE/agent"
ARGS=(--manifests "$MANIFESTS" --node-name "$NODE")
# Every agent run of the demo keeps its state (last-valid.json) in a directory of its own, so
# the demo leaves nothing on the host.
NODEPLANE_STATE_DIR=$(mktemp -d)
export NODEPLANE_STATE_DIR

step "agent --dry-run ${ARGS[*]}"
ruleset=$(mktemp)
ns=""
qos_dir=""
qos_ns=()
fw_ns=()
fw_pids=()
eip_ns=()
svc_ns=()
np_ns=()
cleanup() {
    for n in "${eip_ns[@]}"; do ip netns delete "$n" 2>/dev/null || true; done
    for n in "${svc_ns[@]}"; do ip netns delete "$n" 2>/dev/null || true; done
    for p in "${fw_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for n in "${fw_ns[@]}"; do ip netns delete "$n" 2>/dev/null || true; done
    rm -f "$ruleset" "$ruleset.applied" "$ruleset.resolv" "$ruleset".srv*
    if [ -n "$ns" ]; then ip netns delete "$ns" 2>/dev/null || true; fi
    if [ -n "$qos_dir" ]; then rm -rf "$qos_dir"; fi
    for n in "${qos_ns[@]}"; do ip netns delete "$n" 2>/dev/null || true; done
    for n in "${np_ns[@]}"; do ip netns delete "$n" 2>/dev/null || true; done
    rm -rf "$NODEPLANE_STATE_DIR"
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

# --- EgressQoS on the wire -------------------------------------------------------------------
# A pod netns behind a node netns, an external receiver that prints the DSCP of each datagram
# it gets. The pod's namespace has one rule: DSCP 46 (EF) to 203.0.113.0/24 only.
step "EgressQoS: pod -> node -> external receiver"
command -v python3 >/dev/null || { echo "error: the QoS demo needs python3" >&2; exit 1; }
q="nodeplane-qos-$$"
qos_ns=("$q-node" "$q-pod" "$q-ext")
for n in "${qos_ns[@]}"; do ip netns add "$n"; ip -n "$n" link set lo up; done
ip netns exec "$q-node" sysctl -qw net.ipv4.ip_forward=1
ip -n "$q-node" link add veth0 type veth peer name eth0 netns "$q-pod"
ip -n "$q-node" link add eth0 type veth peer name eth0 netns "$q-ext"
for n in "$q-node" "$q-pod" "$q-ext"; do ip -n "$n" link set eth0 up; done
ip -n "$q-node" link set veth0 up
ip -n "$q-node" addr add 192.168.1.1/24 dev eth0
ip -n "$q-node" route add 10.128.0.5/32 dev veth0
ip -n "$q-node" route add 203.0.113.0/24 via 192.168.1.100
ip -n "$q-node" route add 198.51.100.0/24 via 192.168.1.100
ip -n "$q-pod" addr add 10.128.0.5/32 dev eth0
ip -n "$q-pod" route add 192.168.1.1 dev eth0 scope link
ip -n "$q-pod" route add default via 192.168.1.1 dev eth0
ip -n "$q-ext" addr add 192.168.1.100/24 dev eth0
ip -n "$q-ext" addr add 203.0.113.10/32 dev lo
ip -n "$q-ext" addr add 198.51.100.10/32 dev lo
ip -n "$q-ext" route add 10.128.0.0/14 via 192.168.1.1

qos_dir=$(mktemp -d)
cat >"$qos_dir/cluster.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: sip-0, namespace: voice, labels: {app: sip}}
spec: {nodeName: demo-node, containers: [{name: sip, image: sip}]}
status: {phase: Running, podIP: 10.128.0.5, podIPs: [{ip: 10.128.0.5}]}
---
apiVersion: k8s.ovn.org/v1
kind: EgressQoS
metadata: {name: default, namespace: voice}
spec:
  egress:
  - dscp: 46
    dstCIDR: 203.0.113.0/24
YAML
cat "$qos_dir/cluster.yaml"
step "agent --once in the node netns"
ip netns exec "$q-node" "$AGENT" --once --manifests "$qos_dir" --node-name demo-node \
    --state-dir "$NODEPLANE_STATE_DIR/qos"

# Receiver: one UDP socket per address, reports the TOS byte (IP_RECVTOS) of what arrives.
cat >"$qos_dir/receiver.py" <<'PY'
import select, socket, sys
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)
socks = []
for addr in sys.argv[1:]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
    s.bind((addr, 9000))
    socks.append(s)
print("ready", flush=True)
for _ in range(len(socks)):
    ready, _, _ = select.select(socks, [], [], 5)
    if not ready:
        sys.exit("receiver: nothing arrived within 5 s")
    s = ready[0]
    _, anc, _, peer = s.recvmsg(64, socket.CMSG_SPACE(1))
    tos = anc[0][2][0] if anc else 0
    print(f"  {s.getsockname()[0]:>14} got a datagram from {peer[0]}: TOS 0x{tos:02x} = DSCP {tos >> 2}", flush=True)
    socks.remove(s)
PY
ip netns exec "$q-ext" python3 "$qos_dir/receiver.py" 203.0.113.10 198.51.100.10 >"$qos_dir/recv.log" 2>&1 &
receiver=$!
for _ in $(seq 50); do grep -q ready "$qos_dir/recv.log" && break; sleep 0.1; done
step "pod sends one datagram (TOS 0) to 203.0.113.10 (marked) and one to 198.51.100.10 (not)"
ip netns exec "$q-pod" python3 -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for dst in ("203.0.113.10", "198.51.100.10"):
    s.sendto(b"hello", (dst, 9000))'
wait "$receiver"
grep -v ready "$qos_dir/recv.log"
grep -q "203.0.113.10 got .*DSCP 46$" "$qos_dir/recv.log" || { echo "error: no EF mark" >&2; exit 1; }
grep -q "198.51.100.10 got .*DSCP 0$" "$qos_dir/recv.log" || { echo "error: unexpected mark" >&2; exit 1; }
step "the QoS part of table inet nodeplane (the rule's counter shows the marked packet)"
ip netns exec "$q-node" nft list map inet nodeplane qos-pods-v4
qos_chain=$(ip netns exec "$q-node" nft list map inet nodeplane qos-pods-v4 | grep -o 'qos-[A-Z0-9]*-voice' | head -1)
ip netns exec "$q-node" nft list chain inet nodeplane "$qos_chain"

# --- EgressFirewall on the wire --------------------------------------------------------------
# The example cluster's backend pod (10.128.0.11 on worker-1) behind a node netns running the
# agent on examples/cluster as is; an external host with TCP listeners on 203.0.113.10:443,
# 203.0.113.10:80 and 198.51.100.10:443. The backend firewall allows TCP 443 to 203.0.113.0/24
# (rule 0) and denies everything else outside the cluster (rule 4). The node's uplink is
# worker-1's address on 192.168.50.0/24, where the example EgressIP of the backend API pods
# (192.168.50.100, hosted by worker-1) lives: the allowed connection leaves with that source.
step "EgressFirewall: backend pod -> node -> external host"
f="nodeplane-fw-$$"
fw_ns=("$f-node" "$f-pod" "$f-ext")
for n in "${fw_ns[@]}"; do ip netns add "$n"; ip -n "$n" link set lo up; done
ip netns exec "$f-node" sysctl -qw net.ipv4.ip_forward=1
ip -n "$f-node" link add veth0 type veth peer name eth0 netns "$f-pod"
ip -n "$f-node" link add eth0 type veth peer name eth0 netns "$f-ext"
for n in "$f-node" "$f-pod" "$f-ext"; do ip -n "$n" link set eth0 up; done
ip -n "$f-node" link set veth0 up
ip -n "$f-node" addr add 192.168.50.11/24 dev eth0
ip -n "$f-node" route add 10.128.0.11/32 dev veth0
ip -n "$f-node" route add 203.0.113.0/24 via 192.168.50.1
ip -n "$f-node" route add 198.51.100.0/24 via 192.168.50.1
ip -n "$f-pod" addr add 10.128.0.11/32 dev eth0
ip -n "$f-pod" route add 192.168.50.11 dev eth0 scope link
ip -n "$f-pod" route add default via 192.168.50.11 dev eth0
ip -n "$f-ext" addr add 192.168.50.1/24 dev eth0
ip -n "$f-ext" addr add 203.0.113.10/32 dev lo
ip -n "$f-ext" addr add 198.51.100.10/32 dev lo
ip -n "$f-ext" route add 10.128.0.0/14 via 192.168.50.11
cat "$MANIFESTS/policy/egress-firewall.yaml"
# No DNS server in this demo: a resolver that fails at once (dnsName rules match nothing).
printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$ruleset.resolv"
step "agent --once in the node netns (node worker-1)"
ip netns exec "$f-node" "$AGENT" --once "${ARGS[@]}" --resolv-conf "$ruleset.resolv" 2>&1 | grep -v "^$" | sed 's/^/  /'
ip netns exec "$f-ext" python3 -c '
import socket, threading
socks = []
for a, p in (("203.0.113.10", 443), ("203.0.113.10", 80), ("198.51.100.10", 443)):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((a, p)); s.listen(16); socks.append(s)
def serve(s):
    while True:
        c, peer = s.accept(); c.sendall(peer[0].encode() + b"\n"); c.close()
for s in socks:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()' >"$ruleset.srv" 2>&1 &
fw_pids+=($!)
for _ in $(seq 100); do grep -q ready "$ruleset.srv" && break; sleep 0.1; done
probe() {
    local seen
    if seen=$(ip netns exec "$f-pod" timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2 && head -1 <&3" 2>/dev/null); then
        echo "  $1:$2 connected (the external host saw the source $seen)"; return 0
    fi
    echo "  $1:$2 blocked"; return 1
}
step "backend pod connects"
probe 203.0.113.10 443 || { echo "error: allowed connection failed" >&2; exit 1; }
if probe 203.0.113.10 80; then echo "error: port 80 should be denied" >&2; exit 1; fi
if probe 198.51.100.10 443; then echo "error: 198.51.100.10 should be denied" >&2; exit 1; fi
step "which rule decided: the EgressFirewall map elements that counted packets (comment = rule)"
ip netns exec "$f-node" nft list table inet nodeplane \
    | grep -oE '[^,{=]+ counter packets [1-9][0-9]* bytes [0-9]+ comment "[^"]*" : [a-z]+' \
    | sed -E 's/^\s+/  /'

# --- EgressIP on the wire --------------------------------------------------------------------
# worker-1 and worker-2 of the example cluster on one bridge (192.168.50.0/24) with the backend
# api pods behind them (10.128.0.11 on worker-1, 10.128.2.11 on worker-2) and an external host
# (192.168.50.1, owning 203.0.113.10). The example EgressIP gives the backend api pods the source
# 192.168.50.100, hosted by worker-1: worker-1 holds it and SNATs; worker-2 steers its pod's
# traffic to worker-1 through the np-eip VXLAN tunnel.
step "EgressIP: backend api pods on worker-1 and worker-2 -> external host"
e="nodeplane-eip-$$"
eip_ns=("$e-seg" "$e-w1" "$e-w2" "$e-pod1" "$e-pod2" "$e-ext")
for n in "${eip_ns[@]}"; do ip netns add "$n"; ip -n "$n" link set lo up; done
ip -n "$e-seg" link add br0 type bridge
ip -n "$e-seg" link set br0 up
plug() { # netns, address/len, port name
    ip -n "$1" link add eth0 type veth peer name "$3" netns "$e-seg"
    ip -n "$e-seg" link set "$3" master br0 up
    ip -n "$1" link set eth0 up
    ip -n "$1" addr add "$2" dev eth0
}
plug "$e-w1" 192.168.50.11/24 p1
plug "$e-w2" 192.168.50.12/24 p2
plug "$e-ext" 192.168.50.1/24 p3
ip -n "$e-ext" addr add 203.0.113.10/32 dev lo
pod() { # node netns, pod netns, pod ip, node ip
    ip netns exec "$1" sysctl -qw net.ipv4.ip_forward=1
    ip -n "$1" link add veth0 type veth peer name eth0 netns "$2"
    ip -n "$1" link set veth0 up
    ip -n "$2" link set eth0 up
    ip -n "$1" route add "$3/32" dev veth0
    ip -n "$1" route add 203.0.113.0/24 via 192.168.50.1
    ip -n "$2" addr add "$3/32" dev eth0
    ip -n "$2" route add "$4" dev eth0 scope link
    ip -n "$2" route add default via "$4" dev eth0
}
pod "$e-w1" "$e-pod1" 10.128.0.11 192.168.50.11
pod "$e-w2" "$e-pod2" 10.128.2.11 192.168.50.12
ip -n "$e-w1" route add 10.128.2.0/23 via 192.168.50.12
ip -n "$e-w2" route add 10.128.0.0/23 via 192.168.50.11
cat "$MANIFESTS/policy/egress-ip.yaml" | sed -n '1,20p'
for w in 1 2; do
    step "agent --once on worker-$w"
    ip netns exec "$e-w$w" "$AGENT" --once --manifests "$MANIFESTS" --node-name "worker-$w" \
        --resolv-conf "$ruleset.resolv" 2>&1 | grep -i "egress\|sync done" | sed 's/^/  /'
done
# The external server answers every connection with the source address it saw.
ip netns exec "$e-ext" python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("203.0.113.10", 443)); s.listen(16); print("ready", flush=True)
while True:
    c, peer = s.accept(); c.sendall(peer[0].encode() + b"\n"); c.close()' >"$ruleset.srveip" 2>&1 &
fw_pids+=($!)
# A file of its own: the EgressFirewall step's server wrote "ready" to "$ruleset.srv", and
# waiting on that file could go on before this server listens.
for _ in $(seq 100); do grep -q ready "$ruleset.srveip" && break; sleep 0.1; done
step "each pod connects to 203.0.113.10:443; the external host reports the source it saw"
for p in 1 2; do
    seen=$(ip netns exec "$e-pod$p" timeout 3 bash -c 'exec 3<>/dev/tcp/203.0.113.10/443 && head -1 <&3')
    echo "  pod on worker-$p: external host saw $seen"
    [ "$seen" = 192.168.50.100 ] || { echo "error: expected the egress IP 192.168.50.100" >&2; exit 1; }
done
step "worker-1 holds the egress IP and SNATs through a map keyed on the pod address"
ip -n "$e-w1" -o addr show dev eth0 | sed 's/^/  /'
ip netns exec "$e-w1" nft list map inet nodeplane eip-snat-v4 | sed 's/^/  /'
step "worker-2 steers: mark -> ip rule -> table 7100 -> np-eip (VXLAN) -> worker-1"
ip netns exec "$e-w2" nft list map inet nodeplane eip-steer-v4 | sed 's/^/  /'
ip -n "$e-w2" rule show priority 7100 | sed 's/^/  /'
ip -n "$e-w2" route show table 7100 | sed 's/^/  /'
step "external host's neighbour entry for the egress IP (worker-1's MAC)"
ip -n "$e-ext" neigh show 192.168.50.100 | sed 's/^/  /'
ip -n "$e-w1" link show eth0 | sed -n 2p | sed 's/^/  worker-1 /'
for w in 1 2; do
    ip netns exec "$e-w$w" "$AGENT" cleanup --node-name "worker-$w" 2>/dev/null
done
step "agent cleanup on both nodes: no egress IP, no tunnel, no rules left"
ip -n "$e-w1" -o addr show | grep -c 192.168.50.100 | sed 's/^/  egress IP addresses on worker-1: /' || true
ip -n "$e-w2" link show np-eip 2>/dev/null && { echo "error: np-eip left" >&2; exit 1; }
echo "  np-eip removed"

# --- Services on the wire --------------------------------------------------------------------
# examples/services on worker-1: three web backends (10.128.0.21-23, HTTP-ish on 8080) and a
# client pod (10.128.0.5) behind a node netns; an external host (192.168.1.100). The client
# connects to the ClusterIP 172.30.0.10:80 and the external host to the NodePort 30080; every
# backend answers with its name.
step "Services: client pod and external host -> node -> three backends"
s="nodeplane-svc-$$"
svc_pods=(c 21 22 23)
svc_ns+=("$s-node" "$s-ext")
for n in node ext; do ip netns add "$s-$n"; ip -n "$s-$n" link set lo up; done
ip netns exec "$s-node" sysctl -qw net.ipv4.ip_forward=1
ip -n "$s-node" link add eth0 type veth peer name eth0 netns "$s-ext"
ip -n "$s-node" link set eth0 up; ip -n "$s-ext" link set eth0 up
ip -n "$s-node" addr add 192.168.1.1/24 dev eth0
ip -n "$s-ext" addr add 192.168.1.100/24 dev eth0
ip -n "$s-ext" route add 172.30.0.0/16 via 192.168.1.1
ip -n "$s-node" route add default via 192.168.1.100
for p in "${svc_pods[@]}"; do
    ip="10.128.0.$p"; [ "$p" = c ] && ip=10.128.0.5
    svc_ns+=("$s-$p")
    ip netns add "$s-$p"; ip -n "$s-$p" link set lo up
    ip -n "$s-node" link add "v$p" type veth peer name eth0 netns "$s-$p"
    ip -n "$s-node" link set "v$p" up; ip -n "$s-$p" link set eth0 up
    ip -n "$s-$p" addr add "$ip/32" dev eth0
    ip -n "$s-$p" route add 192.168.1.1 dev eth0 scope link
    ip -n "$s-$p" route add default via 192.168.1.1 dev eth0
    ip -n "$s-node" route add "$ip/32" dev "v$p"
    [ "$p" = c ] && continue
    ip netns exec "$s-$p" python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080)); s.listen(64); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(sys.argv[1].encode() + b"\n"); c.close()' "backend-$p" >"$ruleset.srv$p" 2>&1 &
    fw_pids+=($!)
done
for p in 21 22 23; do for _ in $(seq 100); do grep -q ready "$ruleset.srv$p" && break; sleep 0.1; done; done
ip netns exec "$s-node" "$AGENT" --once --manifests examples/services --node-name worker-1 \
    --resolv-conf "$ruleset.resolv" 2>&1 | grep -i "sync done" | sed 's/^/  /'
ask() { ip netns exec "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/$3 && head -1 <&3"; }
step "client pod -> ClusterIP 172.30.0.10:80, 12 connections"
answers=$(for _ in $(seq 12); do ask "$s-c" 172.30.0.10 80; done | sort | uniq -c)
echo "$answers" | sed 's/^ */  /'
[ "$(echo "$answers" | wc -l)" -ge 2 ] || { echo "error: expected several backends" >&2; exit 1; }
step "external host -> NodePort 192.168.1.1:30080, 12 connections"
for _ in $(seq 12); do ask "$s-ext" 192.168.1.1 30080; done | sort | uniq -c | sed 's/^ */  /'
step "the dispatch maps (one per address shard), the shared pool chains and the backends maps (frontend . bucket -> endpoint)"
ip netns exec "$s-node" nft list table inet nodeplane | sed -n '/map svc-dispatch-v4-/,/^\t}/p' | sed 's/^/  /'
ip netns exec "$s-node" nft list table inet nodeplane | grep -A3 'chain svc-v4-c[0-9]' | sed 's/^/  /'
ip netns exec "$s-node" nft list table inet nodeplane | sed -n '/map svc-backends-v4-/,/^\t}/p' | sed 's/^/  /'

# --- NetworkPolicy on the wire ---------------------------------------------------------------
# worker-1's three pods of the example cluster behind a node netns: the web pod (frontend), the
# API pod (backend, a server on its named port https = 8443) and prometheus (monitoring). The
# example policy api-from-web lets only frontend's web pods reach the API pods on https.
step "NetworkPolicy: web and prometheus pods -> API pod on worker-1"
n="nodeplane-np-$$"
np_ns=("$n-node" "$n-web" "$n-api" "$n-prom")
for x in "${np_ns[@]}"; do ip netns add "$x"; ip -n "$x" link set lo up; done
ip netns exec "$n-node" sysctl -qw net.ipv4.ip_forward=1
ip -n "$n-node" link add eth0 type veth peer name eth1
ip -n "$n-node" link set eth0 up; ip -n "$n-node" link set eth1 up
ip -n "$n-node" addr add 192.168.50.11/24 dev eth0
for p in web:10 api:11 prom:12; do
    name=${p%%:*}; ip="10.128.0.${p##*:}"
    ip -n "$n-node" link add "v$name" type veth peer name eth0 netns "$n-$name"
    ip -n "$n-node" link set "v$name" up; ip -n "$n-$name" link set eth0 up
    ip -n "$n-$name" addr add "$ip/32" dev eth0
    ip -n "$n-$name" route add 192.168.50.11 dev eth0 scope link
    ip -n "$n-$name" route add default via 192.168.50.11 dev eth0
    ip -n "$n-node" route add "$ip/32" dev "v$name"
done
ip netns exec "$n-api" python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8443)); s.listen(16); print("ready", flush=True)
while True:
    c, peer = s.accept(); c.sendall(b"api served " + peer[0].encode() + b"\n"); c.close()' >"$ruleset.srvnp" 2>&1 &
fw_pids+=($!)
for _ in $(seq 100); do grep -q ready "$ruleset.srvnp" && break; sleep 0.1; done
cat "$MANIFESTS/policy/network-policy.yaml"
step "agent --once in the node netns (node worker-1)"
ip netns exec "$n-node" "$AGENT" --once "${ARGS[@]}" --resolv-conf "$ruleset.resolv" 2>&1 \
    | grep -i "networkpolic\|sync done" | sed 's/^/  /'
step "web (frontend) and prometheus (monitoring) connect to the API pod 10.128.0.11:8443"
if out=$(ip netns exec "$n-web" timeout 2 bash -c 'exec 3<>/dev/tcp/10.128.0.11/8443 && head -1 <&3'); then
    echo "  web:        $out"
else
    echo "error: the web pod is allowed by api-from-web but was refused" >&2; exit 1
fi
if ip netns exec "$n-prom" timeout 2 bash -c 'exec 3<>/dev/tcp/10.128.0.11/8443 && head -1 <&3' 2>/dev/null; then
    echo "error: prometheus is not allowed by api-from-web but was served" >&2; exit 1
fi
echo "  prometheus: refused (the API pod is isolated for ingress; no rule allows monitoring)"
step "the policy's chain: one rule, its peers and the named port https (8443) as sets"
np_chain=$(ip netns exec "$n-node" nft list table inet nodeplane | grep -o 'chain np-[A-Z0-9]*-backend_api_from_web-in' | head -1)
ip netns exec "$n-node" nft list chain inet nodeplane "${np_chain#chain }" | sed 's/^/  /'

step "demo done: every feature shown on real packets; nothing left on the host"
