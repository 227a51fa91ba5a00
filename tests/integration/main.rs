//! Integration tests that need no lab: the command line, rendering (checked by `nft -c`, which
//! needs root), the diff engine, sources, deploy files. One binary (one link).

mod api_selector_props;
mod cli;
mod crd_upstream;
mod deploy_crds;
mod deploy_manifests;
mod deploy_rbac;
mod explain_examples;
mod module_graph;
mod nft_diff;
mod render_golden;
mod source_example_cluster;
mod source_limits;
mod source_manifests;
mod source_robustness;
mod source_snapshot;
mod source_watch;
