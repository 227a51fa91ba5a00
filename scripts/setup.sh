#!/usr/bin/env bash
# System packages the build, the demo and the tests need (Debian; run as root). Installs only
# what is missing; `apt-get update` runs once, only when something is to be installed.
set -euo pipefail

# Build: libnftnl/libmnl headers and pkg-config. Runtime of the demo and the kernel tests:
# nft, ip, ping (the lab's ping helper), python3 (the demo's servers), unshare and setpriv
# (util-linux: the lab's DaemonSet sandbox).
PACKAGES=(libnftnl-dev libmnl-dev nftables iproute2 pkg-config iputils-ping gcc libc6-dev
    ca-certificates curl python3 util-linux)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "system packages: all present"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "error: missing packages (${missing[*]}); run as root: sudo bash scripts/setup.sh" >&2
    exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
