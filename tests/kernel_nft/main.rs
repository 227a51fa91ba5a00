//! Kernel tests of the nftables side: the netlink backend against nft itself, and drift
//! repair. One binary (one link) for all of them; they need root and fail, never skip,
//! without it (see docs/testing.md).

mod backend;
mod drift;
mod explain_vs_kernel;
mod quiet;
mod sandbox;
