//! The kernel backend: rtnetlink on a dedicated worker thread.
//!
//! # Threads, runtimes and network namespaces
//!
//! [`RtnlBackend::new`] spawns one OS thread (`nodeplane-rtnl`) that owns a current-thread tokio
//! runtime and the rtnetlink connection; the blocking [`NetBackend`] methods send a job to it
//! and wait for the answer. No runtime is ever created on, or nested in, the caller's runtime,
//! and the backend may be created, used and dropped anywhere (from async code, prefer
//! `tokio::task::spawn_blocking`: a call blocks for the netlink round trips).
//!
//! The worker inherits the network namespace of the thread that called `new`, and all its
//! sockets (netlink, and the `AF_PACKET` socket of the announcements) are opened there: the
//! backend acts in that namespace whichever thread later calls it.

use std::net::IpAddr;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;

use futures::StreamExt;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::{LinkAttribute, LinkLayerType, LinkMessage};
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::route::RouteMessage;
use netlink_packet_route::rule::RuleMessage;
use rtnetlink::Handle;
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST,
    NetlinkMessage, NetlinkPayload,
};
use tokio::sync::mpsc;

use super::announce::{self, Announcement};
use super::bridge_ports::{self, BridgePorts};
use super::conflict;
use super::dump::{dump, netlink_err};
use super::links::{self, OwnedLink, ParsedNeigh, TunnelChanges};
use super::state::{KernelLink, KernelState};
use super::{NetBackend, NetChanges, NetConfig, NetDesired, NetError, addresses, routes, rules};

type Reply<T> = std_mpsc::SyncSender<T>;

enum Job {
    Read(Reply<Result<KernelState, NetError>>),
    BridgePorts(Vec<Vec<IpAddr>>, Reply<Result<BridgePorts, NetError>>),
    Apply(Box<NetChanges>, Reply<ApplyOutcome>),
}

struct ApplyOutcome {
    result: Result<(), NetError>,
    announcer: Option<JoinHandle<()>>,
    /// Addresses another host still held when they were added.
    conflicts: Vec<super::AddressConflict>,
}

/// Addresses, routes and rules through rtnetlink, in the network namespace of its creator.
pub struct RtnlBackend {
    config: NetConfig,
    jobs: Option<mpsc::UnboundedSender<Job>>,
    worker: Option<JoinHandle<()>>,
    announcer: Option<JoinHandle<()>>,
    /// Held addresses another host answered for too, by address.
    conflicts: std::collections::BTreeMap<std::net::IpAddr, super::AddressConflict>,
}

impl RtnlBackend {
    /// Validates `config`, starts the worker and opens the netlink socket (in the caller's
    /// network namespace).
    pub fn new(config: NetConfig) -> Result<RtnlBackend, NetError> {
        config.validate()?;
        let (jobs, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std_mpsc::sync_channel(1);
        let worker_cfg = config.clone();
        let worker = std::thread::Builder::new()
            .name("nodeplane-rtnl".into())
            .spawn(move || worker(worker_cfg, rx, ready_tx))
            .map_err(|e| netlink_err("worker thread", e))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(RtnlBackend {
                config,
                jobs: Some(jobs),
                worker: Some(worker),
                announcer: None,
                conflicts: Default::default(),
            }),
            Ok(Err(e)) => {
                let _ = worker.join();
                Err(e)
            }
            Err(_) => Err(worker_gone()),
        }
    }

    pub fn config(&self) -> &NetConfig {
        &self.config
    }

    /// What the kernel holds now (links, all addresses, routes and rules with the agent's
    /// protocol).
    pub fn read_state(&mut self) -> Result<KernelState, NetError> {
        let (tx, rx) = std_mpsc::sync_channel(1);
        self.send(Job::Read(tx))?;
        rx.recv().map_err(|_| worker_gone())?
    }

    /// The changes [`NetBackend::cleanup`] would make (for `--dry-run`).
    pub fn plan_cleanup(&mut self) -> Result<NetChanges, NetError> {
        self.read_state()?.plan_cleanup(&self.config)
    }

    /// Waits until the repeated announcements of the last apply have been sent.
    pub fn wait_announcements(&mut self) {
        if let Some(h) = self.announcer.take() {
            let _ = h.join();
        }
    }

    fn send(&self, job: Job) -> Result<(), NetError> {
        self.jobs
            .as_ref()
            .ok_or_else(worker_gone)?
            .send(job)
            .map_err(|_| worker_gone())
    }
}

impl NetBackend for RtnlBackend {
    fn plan(&mut self, desired: &NetDesired) -> Result<NetChanges, NetError> {
        self.read_state()?.plan(desired, &self.config)
    }

    fn apply(&mut self, changes: &NetChanges) -> Result<(), NetError> {
        if changes.is_empty() {
            return Ok(());
        }
        let (tx, rx) = std_mpsc::sync_channel(1);
        self.send(Job::Apply(Box::new(changes.clone()), tx))?;
        let outcome = rx.recv().map_err(|_| worker_gone())?;
        if outcome.announcer.is_some() {
            // A previous announcer keeps running detached; it ends after a few intervals.
            self.announcer = outcome.announcer;
        }
        for a in &changes.addresses_del {
            self.conflicts.remove(&a.spec.addr);
        }
        for c in outcome.conflicts {
            self.conflicts.insert(c.addr, c);
        }
        outcome.result
    }

    fn conflicts(&self) -> Vec<super::AddressConflict> {
        self.conflicts.values().cloned().collect()
    }

    fn cleanup(&mut self) -> Result<NetChanges, NetError> {
        let changes = self.plan_cleanup()?;
        self.apply(&changes)?;
        Ok(changes)
    }

    fn bridge_ports(&mut self, pods: &[Vec<IpAddr>]) -> Result<BridgePorts, NetError> {
        let (tx, rx) = std_mpsc::sync_channel(1);
        self.send(Job::BridgePorts(pods.to_vec(), tx))?;
        rx.recv().map_err(|_| worker_gone())?
    }
}

impl Drop for RtnlBackend {
    fn drop(&mut self) {
        // Closing the channel ends the worker's loop; joining is quick (no job is pending:
        // every call waits for its answer).
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn worker_gone() -> NetError {
    NetError::Netlink {
        what: "worker".into(),
        reason: "the rtnetlink worker thread has stopped".into(),
    }
}

fn worker(
    cfg: NetConfig,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    ready: Reply<Result<(), NetError>>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(netlink_err("runtime", e)));
            return;
        }
    };
    rt.block_on(async move {
        let handle = match rtnetlink::new_connection() {
            Ok((conn, handle, _)) => {
                tokio::spawn(conn);
                handle
            }
            Err(e) => {
                let _ = ready.send(Err(netlink_err("socket", e)));
                return;
            }
        };
        // Reading another netns's addresses (`IFA_TARGET_NETNSID`) needs strict checking,
        // which the other dumps do not: a socket of its own.
        let strict = match rtnetlink::new_connection() {
            Ok((mut conn, handle, _)) => {
                use netlink_sys::AsyncSocket;
                if let Err(e) = conn
                    .socket_mut()
                    .socket_mut()
                    .set_netlink_get_strict_chk(true)
                {
                    let _ = ready.send(Err(netlink_err("strict socket", e)));
                    return;
                }
                tokio::spawn(conn);
                handle
            }
            Err(e) => {
                let _ = ready.send(Err(netlink_err("socket", e)));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        let mut peers = bridge_ports::PeerCache::default();
        while let Some(job) = jobs.recv().await {
            match job {
                Job::Read(reply) => {
                    let _ = reply.send(read_state(&handle, &cfg).await);
                }
                Job::BridgePorts(pods, reply) => {
                    let _ = reply.send(bridge_ports::read(&strict, &mut peers, &pods).await);
                }
                Job::Apply(changes, reply) => {
                    let _ = reply.send(apply(&handle, &cfg, &changes).await);
                }
            }
        }
    });
}

async fn read_links(handle: &Handle) -> Result<Vec<KernelLink>, NetError> {
    Ok(read_all_links(handle).await?.0)
}

/// Every link, and the ones carrying the agent's alias.
async fn read_all_links(handle: &Handle) -> Result<(Vec<KernelLink>, Vec<OwnedLink>), NetError> {
    let replies = dump(
        handle,
        "links",
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
    )
    .await?;
    let mut links = Vec::new();
    let mut owned = Vec::new();
    for m in replies {
        if let RouteNetlinkMessage::NewLink(l) = m {
            links.push(parse_link(&l));
            owned.extend(links::parse_owned(&l));
        }
    }
    links.sort_by_key(|l| l.index);
    owned.sort_by_key(|l| l.index);
    Ok((links, owned))
}

/// FDB and neighbour entries on the agent's links.
async fn read_entries(handle: &Handle, state: &mut KernelState) -> Result<(), NetError> {
    if state.owned_links.is_empty() {
        return Ok(());
    }
    for family in [
        AddressFamily::Bridge,
        AddressFamily::Inet,
        AddressFamily::Inet6,
    ] {
        let mut req = NeighbourMessage::default();
        req.header.family = family;
        for m in dump(handle, "neighbours", RouteNetlinkMessage::GetNeighbour(req)).await? {
            if let RouteNetlinkMessage::NewNeighbour(n) = m {
                match links::parse_neigh(&n, state) {
                    Some(ParsedNeigh::Fdb(f)) => state.fdb.push(f),
                    Some(ParsedNeigh::Neigh(e)) => state.neighbours.push(e),
                    None => {}
                }
            }
        }
    }
    Ok(())
}

fn parse_link(msg: &LinkMessage) -> KernelLink {
    let mut name = format!("if{}", msg.header.index);
    let mut mac = None;
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => name = n.clone(),
            LinkAttribute::Address(a) if msg.header.link_layer_type == LinkLayerType::Ether => {
                mac = <[u8; 6]>::try_from(a.as_slice()).ok();
            }
            _ => {}
        }
    }
    KernelLink {
        index: msg.header.index,
        name,
        mac,
    }
}

async fn read_state(handle: &Handle, cfg: &NetConfig) -> Result<KernelState, NetError> {
    let (links, owned_links) = read_all_links(handle).await?;
    let mut state = KernelState {
        links,
        owned_links,
        ..Default::default()
    };
    read_entries(handle, &mut state).await?;
    let get_addr = RouteNetlinkMessage::GetAddress(AddressMessage::default());
    for m in dump(handle, "addresses", get_addr).await? {
        if let RouteNetlinkMessage::NewAddress(a) = m {
            state.addresses.extend(addresses::parse(&a));
        }
    }
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut req = RouteMessage::default();
        req.header.address_family = family;
        for m in dump(handle, "routes", RouteNetlinkMessage::GetRoute(req)).await? {
            if let RouteNetlinkMessage::NewRoute(r) = m {
                // Only the agent's protocol can be owned; skip converting the rest (a node may
                // hold a full BGP table).
                if u8::from(r.header.protocol) == cfg.protocol {
                    state.routes.extend(routes::parse(&r, &state));
                }
            }
        }
    }
    let get_rule = RouteNetlinkMessage::GetRule(RuleMessage::default());
    for m in dump(handle, "rules", get_rule).await? {
        if let RouteNetlinkMessage::NewRule(r) = m {
            state
                .rules
                .extend(rules::parse(&r).filter(|r| r.proto == cfg.protocol));
        }
    }
    Ok(state)
}

/// One change request, acknowledged. Errors whose errno is in `tolerate` count as done (e.g.
/// deleting what is already gone).
async fn execute(
    handle: &Handle,
    object: String,
    op: &'static str,
    request: RouteNetlinkMessage,
    flags: u16,
    tolerate: &[i32],
) -> Result<(), NetError> {
    let mut msg = NetlinkMessage::from(request);
    msg.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    let mut replies = handle
        .clone()
        .request(msg)
        .map_err(|e| netlink_err(&object, e))?;
    while let Some(reply) = replies.next().await {
        if let NetlinkPayload::Error(e) = reply.payload {
            let errno = e.raw_code().abs();
            if errno != 0 && !tolerate.contains(&errno) {
                return Err(NetError::Kernel {
                    object,
                    op,
                    source: e.to_io(),
                });
            }
        }
    }
    tracing::debug!("{op} {object}: done");
    Ok(())
}

const ADD: u16 = NLM_F_CREATE | NLM_F_EXCL;
const REPLACE: u16 = NLM_F_CREATE | NLM_F_REPLACE;

async fn apply(handle: &Handle, cfg: &NetConfig, changes: &NetChanges) -> ApplyOutcome {
    let links = match read_links(handle).await {
        Ok(l) => l,
        Err(e) => {
            return ApplyOutcome {
                result: Err(e),
                announcer: None,
                conflicts: Vec::new(),
            };
        }
    };
    // Before any address goes on: never two holders of one IP on the segment.
    let conflicts = wait_for_holders(changes, &links, cfg);
    let mut added = Vec::new();
    let result = add_addresses(handle, changes, &links, &mut added).await;
    let announcer = announce_added(&added, &links, cfg);
    let result = match result {
        Ok(()) => tunnel_adds(handle, &changes.tunnel).await,
        Err(e) => Err(e),
    };
    let result = match result {
        Ok(links) => apply_rest(handle, changes, &links).await,
        Err(e) => Err(e),
    };
    ApplyOutcome {
        result,
        announcer,
        conflicts,
    }
}

fn link_index(links: &[KernelLink], object: String, dev: &str) -> Result<u32, NetError> {
    links
        .iter()
        .find(|l| l.name == dev)
        .map(|l| l.index)
        .ok_or_else(|| NetError::NoDevice {
            object,
            dev: dev.to_string(),
        })
}

async fn add_addresses(
    handle: &Handle,
    changes: &NetChanges,
    links: &[KernelLink],
    added: &mut Vec<(u32, std::net::IpAddr)>,
) -> Result<(), NetError> {
    for a in &changes.addresses_add {
        let object = format!("address {}", a.spec.addr);
        let index = link_index(links, object.clone(), &a.dev)?;
        let msg = addresses::add_message(&a.spec, index, changes.protocol);
        let req = RouteNetlinkMessage::NewAddress(msg);
        execute(
            handle,
            format!("{object} dev {}", a.dev),
            "add",
            req,
            ADD,
            &[],
        )
        .await?;
        added.push((index, a.spec.addr));
    }
    Ok(())
}

async fn apply_rest(
    handle: &Handle,
    changes: &NetChanges,
    links: &[KernelLink],
) -> Result<(), NetError> {
    let proto = changes.protocol;
    for (list, op, flags) in [
        (&changes.routes_add, "add", ADD),
        (&changes.routes_replace, "replace", REPLACE),
    ] {
        for r in list {
            let req = RouteNetlinkMessage::NewRoute(routes::add_message(r, links, proto)?);
            execute(handle, format!("route {r}"), op, req, flags, &[]).await?;
        }
    }
    for r in &changes.rules_add {
        let req = RouteNetlinkMessage::NewRule(rules::message(r, proto));
        execute(handle, format!("rule {r}"), "add", req, ADD, &[]).await?;
    }
    for r in &changes.rules_del {
        let req = RouteNetlinkMessage::DelRule(rules::message(r, proto));
        execute(handle, format!("rule {r}"), "del", req, 0, &[libc::ENOENT]).await?;
    }
    for r in &changes.routes_del {
        let req = RouteNetlinkMessage::DelRoute(routes::del_message(r, proto));
        execute(handle, format!("route {r}"), "del", req, 0, &[libc::ESRCH]).await?;
    }
    tunnel_dels(handle, &changes.tunnel, links).await?;
    for a in &changes.addresses_del {
        let object = format!("address {}", a.spec.addr);
        // An interface that vanished took its addresses with it.
        let Ok(index) = link_index(links, object.clone(), &a.dev) else {
            continue;
        };
        let req = RouteNetlinkMessage::DelAddress(addresses::del_message(&a.spec, index));
        let tolerate = [libc::EADDRNOTAVAIL, libc::ENODEV];
        execute(
            handle,
            format!("{object} dev {}", a.dev),
            "del",
            req,
            0,
            &tolerate,
        )
        .await?;
    }
    Ok(())
}

/// Probes every address about to be added on an Ethernet-like link (in parallel) and returns
/// once no other host claims them, or after the maximum wait (see `conflict`). Blocks the
/// worker: the reconcile loop waits for the apply anyway. Returns the addresses still held
/// by another host after the maximum wait (added anyway: reported, not withheld).
fn wait_for_holders(
    changes: &NetChanges,
    links: &[KernelLink],
    cfg: &NetConfig,
) -> Vec<super::AddressConflict> {
    if cfg.conflict_probe.is_zero() {
        return Vec::new();
    }
    let candidates: Vec<conflict::Candidate> = changes
        .addresses_add
        .iter()
        .filter_map(|a| {
            let link = links.iter().find(|l| l.name == a.dev)?;
            Some(conflict::Candidate {
                ifindex: link.index,
                dev: link.name.clone(),
                mac: link.mac?,
                addr: a.spec.addr,
            })
        })
        .collect();
    std::thread::scope(|s| {
        let probes: Vec<_> = candidates
            .iter()
            .map(|c| {
                s.spawn(move || {
                    match conflict::wait_until_free(c, cfg.conflict_probe, cfg.conflict_max_wait) {
                        Ok(conflict::Outcome::Free) => None,
                        Ok(conflict::Outcome::Released(after)) => {
                            tracing::info!(
                                "address {}: its previous holder let it go after {after:?}",
                                c.addr
                            );
                            None
                        }
                        Ok(conflict::Outcome::StillHeld(mac)) => {
                            tracing::warn!(
                                "address {}: {} still answers for it after {:?}; adding it \
                                 anyway (reported as EgressIPConflict)",
                                c.addr,
                                MacDisplay(mac),
                                cfg.conflict_max_wait
                            );
                            Some(super::AddressConflict {
                                addr: c.addr,
                                dev: c.dev.clone(),
                                holder: MacDisplay(mac).to_string(),
                            })
                        }
                        Err(e) => {
                            tracing::warn!(
                                "address {}: conflict probe on {} failed ({e}); adding it",
                                c.addr,
                                c.dev
                            );
                            None
                        }
                    }
                })
            })
            .collect();
        probes
            .into_iter()
            .filter_map(|p| p.join().ok().flatten())
            .collect()
    })
}

struct MacDisplay([u8; 6]);

impl std::fmt::Display for MacDisplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// Announces the added addresses that sit on Ethernet-like links. Failures are logged: the
/// address is in place, and neighbours learn it at the latest when their entries expire.
fn announce_added(
    added: &[(u32, std::net::IpAddr)],
    links: &[KernelLink],
    cfg: &NetConfig,
) -> Option<JoinHandle<()>> {
    let list: Vec<Announcement> = added
        .iter()
        .filter_map(|(index, addr)| {
            let link = links.iter().find(|l| l.index == *index)?;
            Some(Announcement {
                ifindex: *index,
                dev: link.name.clone(),
                mac: link.mac?,
                addr: *addr,
            })
        })
        .collect();
    match announce::announce(list, cfg.announce_count, cfg.announce_interval) {
        Ok(done) => {
            for (what, e) in done.failures {
                tracing::warn!("{what}: {e}");
            }
            done.repeats
        }
        Err(e) => {
            tracing::warn!("neighbour announcements: cannot open a packet socket: {e}");
            None
        }
    }
}

/// Creates the tunnel device (first deleting an owned one of the same name it replaces),
/// marks it, brings it up, gives it its IPv4 settings (also to a kept one that lacks them)
/// and adds its entries. Returns the links as they are afterwards (routes over the new
/// device need its index).
async fn tunnel_adds(handle: &Handle, t: &TunnelChanges) -> Result<Vec<KernelLink>, NetError> {
    if let Some(spec) = &t.create {
        let object = format!("link {}", spec.name);
        if t.delete.contains(&spec.name) {
            let links = read_links(handle).await?;
            if let Ok(index) = link_index(&links, object.clone(), &spec.name) {
                let req = RouteNetlinkMessage::DelLink(links::delete_message(index));
                execute(handle, object.clone(), "del", req, 0, &[libc::ENODEV]).await?;
            }
        }
        let req = RouteNetlinkMessage::NewLink(links::create_message(spec));
        execute(handle, object.clone(), "add", req, ADD, &[]).await?;
        let links = read_links(handle).await?;
        let index = link_index(&links, object.clone(), &spec.name)?;
        let req = RouteNetlinkMessage::SetLink(links::up_message(index));
        execute(handle, object.clone(), "set up", req, 0, &[]).await?;
        configure_tunnel(handle, &spec.name, &links).await?;
    } else if let Some(dev) = &t.configure {
        let links = read_links(handle).await?;
        configure_tunnel(handle, dev, &links).await?;
    }
    if let Some(name) = &t.tos_inherit {
        let object = format!("link {name}");
        let links = read_links(handle).await?;
        let index = link_index(&links, object.clone(), name)?;
        let req = RouteNetlinkMessage::NewLink(links::tos_inherit_message(index));
        execute(handle, object, "set tos inherit", req, 0, &[]).await?;
    }
    let links = read_links(handle).await?;
    for f in &t.fdb_add {
        let object = format!("fdb {} dev {}", links::mac_text(&f.mac), f.dev);
        let index = link_index(&links, object.clone(), &f.dev)?;
        let req = RouteNetlinkMessage::NewNeighbour(links::fdb_message(f, index));
        execute(
            handle,
            object,
            "append",
            req,
            NLM_F_CREATE | NLM_F_APPEND,
            &[libc::EEXIST],
        )
        .await?;
    }
    for n in &t.neigh_add {
        let object = format!("neighbour {} dev {}", n.ip, n.dev);
        let index = link_index(&links, object.clone(), &n.dev)?;
        let req = RouteNetlinkMessage::NewNeighbour(links::neigh_message(n, index));
        execute(handle, object, "replace", req, REPLACE, &[]).await?;
    }
    Ok(links)
}

/// [`links::TUNNEL_INET_CONF`] on the tunnel, through RTM_SETLINK (see there why).
async fn configure_tunnel(
    handle: &Handle,
    dev: &str,
    links: &[KernelLink],
) -> Result<(), NetError> {
    let object = format!("link {dev}");
    let index = link_index(links, object.clone(), dev)?;
    let req = RouteNetlinkMessage::SetLink(links::inet_conf_message(index));
    execute(handle, object, "set ipv4 conf", req, 0, &[]).await
}

async fn tunnel_dels(
    handle: &Handle,
    t: &TunnelChanges,
    links: &[KernelLink],
) -> Result<(), NetError> {
    for n in &t.neigh_del {
        let object = format!("neighbour {} dev {}", n.ip, n.dev);
        let Ok(index) = link_index(links, object.clone(), &n.dev) else {
            continue;
        };
        let req = RouteNetlinkMessage::DelNeighbour(links::neigh_message(n, index));
        execute(handle, object, "del", req, 0, &[libc::ENOENT]).await?;
    }
    for f in &t.fdb_del {
        let object = format!("fdb {} dev {}", links::mac_text(&f.mac), f.dev);
        let Ok(index) = link_index(links, object.clone(), &f.dev) else {
            continue;
        };
        let req = RouteNetlinkMessage::DelNeighbour(links::fdb_message(f, index));
        execute(handle, object, "del", req, 0, &[libc::ENOENT]).await?;
    }
    for name in &t.delete {
        if t.create.as_ref().is_some_and(|c| &c.name == name) {
            continue; // replaced before the create
        }
        let object = format!("link {name}");
        let Ok(index) = link_index(links, object.clone(), name) else {
            continue;
        };
        let req = RouteNetlinkMessage::DelLink(links::delete_message(index));
        execute(handle, object, "del", req, 0, &[libc::ENODEV]).await?;
    }
    Ok(())
}
