//! The node's view of the cluster: an immutable, indexed set of objects.
//!
//! Sources (manifests, kube) build a [`Snapshot`] with a [`SnapshotBuilder`]; planners read it.
//! Objects are `Arc`ed and every map is a persistent ordered map ([`ObjectMap`]): cloning a
//! snapshot, turning it into a builder and building it again are O(1), and applying a delta
//! costs O(change x log n) (the indexes are kept up to date on each insert and remove).
//! Consecutive snapshots share every untouched subtree, so [`changes`] between them costs
//! the size of the change, not of the cluster. Maps are ordered so that iteration order,
//! and therefore planner output, is deterministic.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::Deserialize;

use crate::api::{
    CloudPrivateIPConfig, EgressFirewall, EgressIP, EgressQoS, EndpointSlice, Endpoints, Namespace,
    NetworkPolicy, Node, ObjectMeta, Pod, Service,
};

/// Label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// `namespace/name`; `namespace` is empty for cluster-scoped objects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> ObjectKey {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub fn cluster(name: impl Into<String>) -> ObjectKey {
        ObjectKey {
            namespace: String::new(),
            name: name.into(),
        }
    }

    /// The key of an object as stored: `namespace` is ignored for cluster-scoped kinds.
    pub fn of(kind: Kind, meta: &ObjectMeta) -> ObjectKey {
        let name = meta.name.clone().unwrap_or_default();
        if kind.is_namespaced() {
            ObjectKey::new(meta.namespace.clone().unwrap_or_default(), name)
        } else {
            ObjectKey::cluster(name)
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// The key of a kind's map, and the part of an [`ObjectKey`] it is: namespace/name for
/// namespaced kinds, the name alone for cluster-scoped ones.
macro_rules! map_key {
    (true) => {
        ObjectKey
    };
    (false) => {
        String
    };
    (true, $key:expr) => {
        $key
    };
    (false, $key:expr) => {
        &$key.name
    };
}

/// Declares [`Kind`], [`AnyObject`], the per-kind maps of a snapshot and their accessors
/// from one table (a row: `field: Variant(type) = apiVersion, namespaced: bool;`) so that
/// they cannot drift.
macro_rules! kinds {
    ($($field:ident: $variant:ident($ty:ty) = $api_version:literal, namespaced: $namespaced:tt;)*) => {
        /// Every object kind the agent understands.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Kind { $($variant,)* }

        impl Kind {
            pub const ALL: &'static [Kind] = &[$(Kind::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self { $(Kind::$variant => stringify!($variant),)* }
            }

            pub fn api_version(self) -> &'static str {
                match self { $(Kind::$variant => $api_version,)* }
            }

            pub fn is_namespaced(self) -> bool {
                match self { $(Kind::$variant => $namespaced,)* }
            }
        }

        /// One object of any supported kind.
        #[derive(Debug, Clone, PartialEq)]
        pub enum AnyObject { $($variant(Arc<$ty>),)* }

        impl AnyObject {
            pub fn kind(&self) -> Kind {
                match self { $(AnyObject::$variant(_) => Kind::$variant,)* }
            }

            pub fn meta(&self) -> &ObjectMeta {
                match self { $(AnyObject::$variant(o) => &o.metadata,)* }
            }

            /// Copy-on-write access to the metadata (free right after decoding).
            pub fn meta_mut(&mut self) -> &mut ObjectMeta {
                match self { $(AnyObject::$variant(o) => &mut Arc::make_mut(o).metadata,)* }
            }

            /// Decodes an object of a known kind from any serde format.
            pub fn deserialize<'de, D: serde::Deserializer<'de>>(kind: Kind, d: D) -> Result<AnyObject, D::Error> {
                Ok(match kind { $(Kind::$variant => AnyObject::$variant(Arc::new(<$ty>::deserialize(d)?)),)* })
            }
        }

        $(
            impl From<$ty> for AnyObject {
                fn from(o: $ty) -> AnyObject { AnyObject::$variant(Arc::new(o)) }
            }
            impl From<Arc<$ty>> for AnyObject {
                fn from(o: Arc<$ty>) -> AnyObject { AnyObject::$variant(o) }
            }
        )*

        /// The objects, one map per kind.
        #[derive(Debug, Clone, Default, PartialEq)]
        struct Objects { $($field: ObjectMap<map_key!($namespaced), $ty>,)* }

        impl Objects {
            /// Stores `obj` at `key`; returns the object it replaced.
            fn insert(&mut self, key: &ObjectKey, obj: AnyObject) -> Option<AnyObject> {
                match obj {
                    $(AnyObject::$variant(o) => {
                        self.$field.insert(map_key!($namespaced, key).clone(), o).map(AnyObject::from)
                    })*
                }
            }

            fn remove(&mut self, kind: Kind, key: &ObjectKey) -> Option<AnyObject> {
                match kind {
                    $(Kind::$variant => {
                        self.$field.remove(map_key!($namespaced, key)).map(AnyObject::from)
                    })*
                }
            }

            fn get(&self, kind: Kind, key: &ObjectKey) -> Option<AnyObject> {
                match kind {
                    $(Kind::$variant => {
                        self.$field.get(map_key!($namespaced, key)).cloned().map(AnyObject::from)
                    })*
                }
            }

            fn clear(&mut self, kind: Kind) {
                match kind { $(Kind::$variant => self.$field.clear(),)* }
            }

            fn len(&self, kind: Kind) -> usize {
                match kind { $(Kind::$variant => self.$field.len(),)* }
            }

            /// Every object, kinds in [`Kind::ALL`] order, then by key.
            fn iter(&self) -> impl Iterator<Item = AnyObject> + '_ {
                let all = std::iter::empty();
                $(let all = all.chain(self.$field.values().cloned().map(AnyObject::from));)*
                all
            }
        }

        impl Snapshot {
            $(
                #[doc = concat!("Every ", stringify!($variant), " object, in key order.")]
                pub fn $field(&self) -> &ObjectMap<map_key!($namespaced), $ty> {
                    &self.inner.objects.$field
                }
            )*
        }
    };
}

kinds! {
    namespaces: Namespace(Namespace) = "v1", namespaced: false;
    pods: Pod(Pod) = "v1", namespaced: true;
    nodes: Node(Node) = "v1", namespaced: false;
    services: Service(Service) = "v1", namespaced: true;
    endpoints: Endpoints(Endpoints) = "v1", namespaced: true;
    endpoint_slices: EndpointSlice(EndpointSlice) = "discovery.k8s.io/v1", namespaced: true;
    egress_firewalls: EgressFirewall(EgressFirewall) = "k8s.ovn.org/v1", namespaced: true;
    egress_qoses: EgressQoS(EgressQoS) = "k8s.ovn.org/v1", namespaced: true;
    egress_ips: EgressIP(EgressIP) = "k8s.ovn.org/v1", namespaced: false;
    cloud_private_ip_configs: CloudPrivateIPConfig(CloudPrivateIPConfig) =
        "cloud.network.openshift.io/v1", namespaced: false;
    network_policies: NetworkPolicy(NetworkPolicy) = "networking.k8s.io/v1", namespaced: true;
}

impl Kind {
    /// Dispatch on a manifest's `apiVersion` and `kind`.
    pub fn from_type(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::from_name(kind).filter(|k| k.api_version() == api_version)
    }

    /// The kind with this name, whatever its apiVersion (to explain version mismatches).
    pub fn from_name(kind: &str) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| k.as_str() == kind)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AnyObject {
    pub fn key(&self) -> ObjectKey {
        ObjectKey::of(self.kind(), self.meta())
    }

    /// Brings an object to the form the snapshot stores: `managedFields` and kubectl's
    /// last-applied annotation dropped (large and never read), namespaced objects without a
    /// namespace put in `default` (as kubectl does), and any namespace on a cluster-scoped
    /// object cleared.
    pub fn normalize(&mut self) {
        let namespaced = self.kind().is_namespaced();
        let meta = self.meta_mut();
        meta.managed_fields = None;
        if let Some(a) = meta.annotations.as_mut() {
            a.remove(LAST_APPLIED);
        }
        if !namespaced {
            meta.namespace = None;
        } else if meta.namespace.as_deref().unwrap_or_default().is_empty() {
            meta.namespace = Some("default".to_string());
        }
    }
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The objects of one kind by key: a persistent ordered map (O(1) clone, shared subtrees).
pub type ObjectMap<K, T> = imbl::OrdMap<K, Arc<T>>;

/// Indexes over the objects, updated with every insert and remove.
#[derive(Debug, Clone, Default, PartialEq)]
struct Indexes {
    /// spec.nodeName -> pods.
    pods_by_node: imbl::OrdMap<String, imbl::OrdSet<ObjectKey>>,
    /// (namespace, kubernetes.io/service-name) -> slices, sorted. A vector, not a tree: a
    /// service has one to a few slices, and an `OrdSet` leaf is ~800 bytes (8 MB at
    /// 10,000 services).
    slices_by_service: imbl::OrdMap<ObjectKey, Vec<ObjectKey>>,
    /// ClusterIP (`spec.clusterIP` and `spec.clusterIPs`) -> services, sorted: one as a
    /// rule, more only while an address moves between services.
    services_by_cluster_ip: imbl::OrdMap<IpAddr, Vec<ObjectKey>>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Inner {
    /// One map per kind (declared by `kinds!`).
    objects: Objects,
    indexes: Indexes,
}

/// An immutable view of the cluster. `Clone` is O(1).
#[derive(Clone, Default, PartialEq)]
pub struct Snapshot {
    inner: Arc<Inner>,
}

/// Accumulates objects (and keeps the indexes); `build` freezes the result.
#[derive(Debug, Clone, Default)]
pub struct SnapshotBuilder {
    inner: Inner,
}

impl SnapshotBuilder {
    pub fn new() -> SnapshotBuilder {
        SnapshotBuilder::default()
    }

    /// Inserts or replaces an object (keyed by kind, namespace and name); returns the object it
    /// replaced. Sources are expected to reject objects without a name before inserting.
    pub fn insert(&mut self, obj: impl Into<AnyObject>) -> Option<AnyObject> {
        let obj = obj.into();
        let key = obj.key();
        self.inner.indexes.add(&key, &obj);
        let old = self.inner.objects.insert(&key, obj.clone());
        if let Some(old) = &old {
            self.inner.indexes.drop_stale(&key, old, Some(&obj));
        }
        old
    }

    /// Chaining form of [`insert`](Self::insert), handy in tests.
    pub fn with(mut self, obj: impl Into<AnyObject>) -> SnapshotBuilder {
        self.insert(obj);
        self
    }

    /// Removes an object; for cluster-scoped kinds only `key.name` is used.
    pub fn remove(&mut self, kind: Kind, key: &ObjectKey) -> Option<AnyObject> {
        let old = self.inner.objects.remove(kind, key);
        if let Some(old) = &old {
            self.inner.indexes.drop_stale(&old.key(), old, None);
        }
        old
    }

    /// Removes every object of one kind (a kube source relisting that kind).
    pub fn clear_kind(&mut self, kind: Kind) {
        self.inner.objects.clear(kind);
        match kind {
            Kind::Pod => self.inner.indexes.pods_by_node.clear(),
            Kind::EndpointSlice => self.inner.indexes.slices_by_service.clear(),
            Kind::Service => self.inner.indexes.services_by_cluster_ip.clear(),
            _ => {}
        }
    }

    /// Freezes the builder: O(1), the indexes are already up to date.
    pub fn build(self) -> Snapshot {
        Snapshot {
            inner: Arc::new(self.inner),
        }
    }
}

/// An index entry of an object: (index, index key).
#[derive(PartialEq)]
enum IndexEntry {
    PodOnNode(String),
    SliceOfService(ObjectKey),
    ServiceClusterIp(IpAddr),
}

impl IndexEntry {
    /// The entries `obj` (stored at `key`) has: none, one, or a service's ClusterIPs.
    fn of(key: &ObjectKey, obj: &AnyObject) -> Vec<IndexEntry> {
        match obj {
            AnyObject::Pod(pod) => pod_node_name(pod)
                .map(|n| IndexEntry::PodOnNode(n.to_string()))
                .into_iter()
                .collect(),
            AnyObject::EndpointSlice(slice) => labels(&slice.metadata)
                .get(SERVICE_NAME_LABEL)
                .map(|svc| {
                    IndexEntry::SliceOfService(ObjectKey::new(key.namespace.clone(), svc.clone()))
                })
                .into_iter()
                .collect(),
            AnyObject::Service(svc) => service_cluster_ips(svc)
                .into_iter()
                .map(IndexEntry::ServiceClusterIp)
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl Indexes {
    /// Indexes `obj` (stored at `key`).
    fn add(&mut self, key: &ObjectKey, obj: &AnyObject) {
        for entry in IndexEntry::of(key, obj) {
            match entry {
                IndexEntry::PodOnNode(node) => {
                    self.pods_by_node
                        .entry(node)
                        .or_default()
                        .insert(key.clone());
                }
                IndexEntry::SliceOfService(svc) => {
                    insert_sorted(self.slices_by_service.entry(svc).or_default(), key)
                }
                IndexEntry::ServiceClusterIp(ip) => {
                    insert_sorted(self.services_by_cluster_ip.entry(ip).or_default(), key)
                }
            }
        }
    }

    /// Unindexes `old` (which was at `key`) from the entries that `now`, the object stored
    /// there now, does not have.
    fn drop_stale(&mut self, key: &ObjectKey, old: &AnyObject, now: Option<&AnyObject>) {
        let was = IndexEntry::of(key, old);
        if was.is_empty() {
            return;
        }
        let is = now.map(|n| IndexEntry::of(key, n)).unwrap_or_default();
        for entry in was.into_iter().filter(|e| !is.contains(e)) {
            match entry {
                IndexEntry::PodOnNode(node) => remove_from(&mut self.pods_by_node, &node, key),
                IndexEntry::SliceOfService(svc) => {
                    remove_sorted(&mut self.slices_by_service, &svc, key)
                }
                IndexEntry::ServiceClusterIp(ip) => {
                    remove_sorted(&mut self.services_by_cluster_ip, &ip, key)
                }
            }
        }
    }
}

fn insert_sorted(keys: &mut Vec<ObjectKey>, key: &ObjectKey) {
    if let Err(i) = keys.binary_search(key) {
        keys.insert(i, key.clone());
    }
}

/// Removes `key` from the vector at `index[at]`, and the vector once empty.
fn remove_sorted<K: Ord + Clone>(
    index: &mut imbl::OrdMap<K, Vec<ObjectKey>>,
    at: &K,
    key: &ObjectKey,
) {
    if let Some(keys) = index.get_mut(at) {
        keys.retain(|k| k != key);
        if keys.is_empty() {
            index.remove(at);
        }
    }
}

/// A service's ClusterIPs (`spec.clusterIPs` and `spec.clusterIP`), without `None` (headless)
/// and anything else that is not an address.
pub fn service_cluster_ips(svc: &Service) -> Vec<IpAddr> {
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    let mut ips: Vec<IpAddr> = spec
        .cluster_ips
        .iter()
        .flatten()
        .chain(spec.cluster_ip.iter())
        .filter_map(|ip| ip.parse().ok())
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

/// Removes `key` from the set at `index[at]`, and the set once empty.
fn remove_from<K: Ord + Clone>(
    index: &mut imbl::OrdMap<K, imbl::OrdSet<ObjectKey>>,
    at: &K,
    key: &ObjectKey,
) {
    if let Some(set) = index.get_mut(at) {
        set.remove(key);
        if set.is_empty() {
            index.remove(at);
        }
    }
}

/// What changed in one kind between two snapshots: (key, before, after) for every object
/// added (`None` before), removed (`None` after) or replaced by a different one. Subtrees the
/// two maps share are skipped, so consecutive snapshots cost the size of their difference.
pub fn changes<'a, K: Ord + Clone, T: PartialEq>(
    prev: &'a ObjectMap<K, T>,
    cur: &'a ObjectMap<K, T>,
) -> impl Iterator<Item = (&'a K, Option<&'a Arc<T>>, Option<&'a Arc<T>>)> + 'a {
    use imbl::ordmap::DiffItem;
    prev.diff(cur).map(|d| match d {
        DiffItem::Add(k, v) => (k, None, Some(v)),
        DiffItem::Remove(k, v) => (k, Some(v), None),
        DiffItem::Update { old, new } => (new.0, Some(old.1), Some(new.1)),
    })
}

/// Values in a namespaced map whose key is in `namespace`, in name order.
fn in_namespace<'a, T>(
    map: &'a ObjectMap<ObjectKey, T>,
    namespace: &'a str,
) -> impl Iterator<Item = &'a Arc<T>> + 'a {
    map.range(ObjectKey::new(namespace, "")..)
        .take_while(move |(k, _)| k.namespace == namespace)
        .map(|(_, v)| v)
}

fn get_ns<'a, T>(
    map: &'a ObjectMap<ObjectKey, T>,
    namespace: &str,
    name: &str,
) -> Option<&'a Arc<T>> {
    map.get(&ObjectKey::new(namespace, name))
}

impl Snapshot {
    pub fn builder() -> SnapshotBuilder {
        SnapshotBuilder::new()
    }

    /// A builder holding this snapshot's objects (pointer copies), to apply a delta.
    pub fn to_builder(&self) -> SnapshotBuilder {
        SnapshotBuilder {
            inner: (*self.inner).clone(),
        }
    }

    /// True if both handles point at the same snapshot (no comparison of contents).
    pub fn ptr_eq(&self, other: &Snapshot) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub fn namespace(&self, name: &str) -> Option<&Arc<Namespace>> {
        self.namespaces().get(name)
    }
    pub fn node(&self, name: &str) -> Option<&Arc<Node>> {
        self.nodes().get(name)
    }
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Arc<Pod>> {
        get_ns(self.pods(), namespace, name)
    }
    pub fn service(&self, namespace: &str, name: &str) -> Option<&Arc<Service>> {
        get_ns(self.services(), namespace, name)
    }
    /// The Endpoints object of a service (same namespace and name).
    pub fn endpoints_for_service(&self, namespace: &str, name: &str) -> Option<&Arc<Endpoints>> {
        get_ns(self.endpoints(), namespace, name)
    }
    /// The namespace's EgressFirewall; only the one named `default` counts.
    pub fn egress_firewall(&self, namespace: &str) -> Option<&Arc<EgressFirewall>> {
        get_ns(self.egress_firewalls(), namespace, "default")
    }
    /// The namespace's EgressQoS; only the one named `default` counts.
    pub fn egress_qos(&self, namespace: &str) -> Option<&Arc<EgressQoS>> {
        get_ns(self.egress_qoses(), namespace, "default")
    }

    /// Labels of a namespace; `None` if the namespace is unknown.
    pub fn namespace_labels(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        self.namespace(namespace).map(|ns| labels(&ns.metadata))
    }

    pub fn pods_in_namespace<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a Arc<Pod>> + 'a {
        in_namespace(self.pods(), namespace)
    }

    pub fn services_in_namespace<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a Arc<Service>> + 'a {
        in_namespace(self.services(), namespace)
    }

    /// Pods scheduled to `node` (by spec.nodeName), in namespace/name order.
    pub fn pods_on_node<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a Arc<Pod>> + 'a {
        let pods = self.pods();
        self.inner
            .indexes
            .pods_by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(move |k| pods.get(k))
    }

    /// Pods on `node` whose traffic the node's dataplane handles: on the pod network (not
    /// hostNetwork) and not finished (a Succeeded/Failed pod's IP may belong to another pod).
    pub fn pod_network_pods_on_node<'a>(
        &'a self,
        node: &str,
    ) -> impl Iterator<Item = &'a Arc<Pod>> + 'a {
        self.pods_on_node(node)
            .filter(|p| !pod_is_host_network(p) && !pod_is_terminal(p))
    }

    /// Services with `ip` among their ClusterIPs (one, unless an address is moving between
    /// services), in namespace/name order: O(log services).
    pub fn services_with_cluster_ip(&self, ip: IpAddr) -> impl Iterator<Item = &Arc<Service>> {
        let services = self.services();
        self.inner
            .indexes
            .services_by_cluster_ip
            .get(&ip)
            .into_iter()
            .flatten()
            .filter_map(move |k| services.get(k))
    }

    /// EndpointSlices labelled `kubernetes.io/service-name: <name>` in the service's namespace.
    pub fn endpoint_slices_for_service<'a>(
        &'a self,
        namespace: &str,
        name: &str,
    ) -> impl Iterator<Item = &'a Arc<EndpointSlice>> + 'a {
        let slices = self.endpoint_slices();
        let key = ObjectKey::new(namespace, name);
        self.inner
            .indexes
            .slices_by_service
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(move |k| slices.get(k))
    }

    pub fn get(&self, kind: Kind, key: &ObjectKey) -> Option<AnyObject> {
        self.inner.objects.get(kind, key)
    }

    /// Number of objects of one kind.
    pub fn count(&self, kind: Kind) -> usize {
        self.inner.objects.len(kind)
    }

    /// Object counts per kind, kinds with no objects omitted.
    pub fn counts(&self) -> BTreeMap<Kind, usize> {
        Kind::ALL
            .iter()
            .map(|k| (*k, self.count(*k)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    pub fn len(&self) -> usize {
        Kind::ALL.iter().map(|k| self.count(*k)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every object, kinds in [`Kind::ALL`] order, then by key.
    pub fn objects(&self) -> impl Iterator<Item = AnyObject> + '_ {
        self.inner.objects.iter()
    }
}

/// A summary, not a dump: snapshots can hold thousands of objects.
impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("counts", &self.counts())
            .finish()
    }
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// An object's labels; an empty map when it has none.
pub fn labels(meta: &ObjectMeta) -> &BTreeMap<String, String> {
    meta.labels.as_ref().unwrap_or(&NO_LABELS)
}

/// A pod's IPs from status.podIPs, falling back to status.podIP; unparsable entries skipped,
/// order kept (the first is the primary), duplicates removed.
pub fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let listed = status.pod_ips.iter().flatten().map(|p| p.ip.as_str());
    let mut ips: Vec<IpAddr> = Vec::new();
    for raw in listed.chain(status.pod_ip.as_deref()) {
        if let Ok(ip) = raw.parse()
            && !ips.contains(&ip)
        {
            ips.push(ip);
        }
    }
    ips
}

pub fn pod_node_name(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// Host-network pods share the node's addresses; per-pod rules must not match them.
pub fn pod_is_host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// Succeeded and Failed pods keep their IP in status but it may already belong to another pod.
pub fn pod_is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// A node's addresses of the given types (e.g. `["InternalIP"]`), parsed, in status order,
/// without duplicates.
pub fn node_addresses(node: &Node, types: &[&str]) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = Vec::new();
    let addresses = node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten());
    for a in addresses.filter(|a| types.contains(&a.type_.as_str())) {
        if let Ok(ip) = a.address.parse()
            && !ips.contains(&ip)
        {
            ips.push(ip);
        }
    }
    ips
}

/// InternalIP addresses: what the node uses inside the cluster.
pub fn node_internal_ips(node: &Node) -> Vec<IpAddr> {
    node_addresses(node, &["InternalIP"])
}

/// The node's primary address per family, as kube-proxy picks it: the first InternalIP of
/// the family, else its first ExternalIP.
pub fn node_primary_ips(node: &Node) -> Vec<IpAddr> {
    let ordered = node_internal_ips(node)
        .into_iter()
        .chain(node_addresses(node, &["ExternalIP"]));
    let mut out: Vec<IpAddr> = Vec::new();
    for ip in ordered {
        if !out.iter().any(|o| o.is_ipv4() == ip.is_ipv4()) {
            out.push(ip);
        }
    }
    out
}

/// InternalIP and ExternalIP addresses: everything that identifies the node on the network
/// (addresses an egress IP must not collide with).
pub fn node_ips(node: &Node) -> Vec<IpAddr> {
    node_addresses(node, &["InternalIP", "ExternalIP"])
}

/// The annotation in which OVN-Kubernetes (and each agent, for its own node) publishes the
/// node's host addresses with their prefixes, secondary interfaces included.
pub const HOST_CIDRS_ANNOTATION: &str = "k8s.ovn.org/host-cidrs";

/// Parses a `k8s.ovn.org/host-cidrs` value: a JSON list of `address/prefix` strings; an entry
/// that is not one is an error, and so is a prefix of length 0 (a node claiming every address).
pub fn parse_host_cidrs(value: &str) -> Result<Vec<IpNet>, String> {
    let items: Vec<String> =
        serde_json::from_str(value).map_err(|e| format!("not a JSON list of strings: {e}"))?;
    items
        .iter()
        .map(|s| match s.parse::<IpNet>() {
            Ok(net) if net.prefix_len() == 0 => Err(format!("{s:?}: prefix length 0")),
            Ok(net) => Ok(net),
            Err(_) => Err(format!("{s:?} is not an address/prefix")),
        })
        .collect()
}

/// The node's `k8s.ovn.org/host-cidrs`, when the annotation is present.
pub fn node_host_cidrs(node: &Node) -> Option<Result<Vec<IpNet>, String>> {
    let value = node
        .metadata
        .annotations
        .as_ref()?
        .get(HOST_CIDRS_ANNOTATION)?;
    Some(parse_host_cidrs(value))
}

/// Every address of the node, as OVN-Kubernetes' EgressFirewall `nodeSelector` takes them:
/// the addresses of its `k8s.ovn.org/host-cidrs` (secondary interfaces included; a malformed
/// annotation counts as absent), plus its InternalIP and ExternalIP addresses.
pub fn node_host_addresses(node: &Node) -> Vec<IpAddr> {
    let mut ips = node_ips(node);
    for net in node_host_cidrs(node)
        .and_then(Result::ok)
        .unwrap_or_default()
    {
        if !ips.contains(&net.addr()) {
            ips.push(net.addr());
        }
    }
    ips
}
