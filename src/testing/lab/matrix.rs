//! Truth-table probing in the style of the upstream NetworkPolicy e2e suite
//! (`test/e2e/network/netpol`): probe every (client, server) pair on one port and protocol,
//! compare with the expected table, and on a mismatch print expected, observed and the
//! cells that differ. Probes run in parallel, so a table of denied cells costs one timeout.

use std::fmt::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::netns::Ns;

/// What one cell probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    Tcp(u16),
    Udp(u16),
}

/// A client (a netns) or a server (an address), named for the table.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub name: String,
    pub ns: Ns,
    pub addr: IpAddr,
}

/// Allowed (`true`) or not, per (client row, server column).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truth {
    rows: Vec<String>,
    cols: Vec<String>,
    cells: Vec<Vec<bool>>,
}

impl Truth {
    /// The table `allowed(client, server)` says.
    pub fn expected(
        clients: &[Endpoint],
        servers: &[Endpoint],
        allowed: impl Fn(&str, &str) -> bool,
    ) -> Truth {
        Truth {
            rows: clients.iter().map(|c| c.name.clone()).collect(),
            cols: servers.iter().map(|s| s.name.clone()).collect(),
            cells: clients
                .iter()
                .map(|c| servers.iter().map(|s| allowed(&c.name, &s.name)).collect())
                .collect(),
        }
    }

    /// `.` allowed, `X` blocked (the e2e suite's notation); with `other`, `X` marks cells
    /// that differ.
    fn render(&self, mark: impl Fn(usize, usize) -> char) -> String {
        let width = self.rows.iter().map(String::len).max().unwrap_or(0);
        let mut out = format!("{:width$} ", "");
        for c in &self.cols {
            let _ = write!(out, " {c}");
        }
        out.push('\n');
        for (i, r) in self.rows.iter().enumerate() {
            let _ = write!(out, "{r:width$} ");
            for (j, c) in self.cols.iter().enumerate() {
                let _ = write!(out, " {:^w$}", mark(i, j), w = c.len());
            }
            out.push('\n');
        }
        out
    }

    fn show(&self) -> String {
        self.render(|i, j| if self.cells[i][j] { '.' } else { 'X' })
    }
}

/// Probes every client against every server (TCP connect or UDP exchange within
/// `timeout`); a reply is "allowed", anything else (timeout, refusal, unreachable) is not.
pub fn probe_all(
    clients: &[Endpoint],
    servers: &[Endpoint],
    probe: Probe,
    timeout: Duration,
) -> Truth {
    let cells = std::thread::scope(|s| {
        let handles: Vec<Vec<_>> = clients
            .iter()
            .map(|c| {
                servers
                    .iter()
                    .map(|srv| s.spawn(move || probe_one(&c.ns, srv.addr, probe, timeout)))
                    .collect()
            })
            .collect();
        handles
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .map(|h| h.join().expect("probe thread"))
                    .collect()
            })
            .collect()
    });
    Truth {
        rows: clients.iter().map(|c| c.name.clone()).collect(),
        cols: servers.iter().map(|s| s.name.clone()).collect(),
        cells,
    }
}

fn probe_one(client: &Ns, addr: IpAddr, probe: Probe, timeout: Duration) -> bool {
    match probe {
        Probe::Tcp(port) => client
            .tcp_connect(SocketAddr::new(addr, port), timeout)
            .is_reply(),
        Probe::Udp(port) => client
            .udp_exchange(SocketAddr::new(addr, port), timeout)
            .is_reply(),
    }
}

/// Probes the matrix and panics, printing expected, observed and the differing cells, when
/// it is not `allowed`. A mismatch is probed once more (the e2e suite retries too) so that a
/// probe lost to a loaded machine is not a failure; a real difference persists.
#[track_caller]
pub fn assert_truth(
    case: &str,
    clients: &[Endpoint],
    servers: &[Endpoint],
    probe: Probe,
    allowed: impl Fn(&str, &str) -> bool,
) {
    let expected = Truth::expected(clients, servers, allowed);
    let timeout = Duration::from_millis(700);
    let mut observed = probe_all(clients, servers, probe, timeout);
    if observed != expected {
        observed = probe_all(clients, servers, probe, timeout * 2);
    }
    if observed != expected {
        let diff = expected.render(|i, j| {
            if expected.cells[i][j] == observed.cells[i][j] {
                '.'
            } else {
                'X'
            }
        });
        panic!(
            "{case}: {probe:?} truth table differs\nexpected:\n{}observed:\n{}differences (X):\n{diff}",
            expected.show(),
            observed.show()
        );
    }
}
