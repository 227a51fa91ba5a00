//! nftables engine: typed IR, renderer, diff and the netlink backend.
