//! The node view of the cluster.
