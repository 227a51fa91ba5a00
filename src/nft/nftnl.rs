//! Netlink backend (being written).
