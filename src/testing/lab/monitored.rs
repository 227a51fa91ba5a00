//! The agent's drift monitor of our table in a netns of its own, for the drift tests.

use std::sync::mpsc;

use super::{Exclusive, Lab, Ns, exclusive};
use crate::nft::TABLE_NAME;
use crate::nft::monitor::{Drift, Monitor};

/// A fresh netns with the drift monitor of `table inet nodeplane` started in it and its
/// reports on `rx`, alone on the machine: how soon a drift is heard is part of what these
/// tests check, so no other lab runs meanwhile.
pub struct Monitored {
    pub ns: Ns,
    pub monitor: Monitor,
    pub rx: mpsc::Receiver<Drift>,
    _lab: Lab,
    _alone: Exclusive,
}

impl Monitored {
    /// Host netns `role` with a monitor of `rcvbuf` bytes of receive buffer
    /// ([`Monitor::start_with`]).
    pub fn start(role: &str, rcvbuf: usize) -> Monitored {
        let _alone = exclusive();
        let mut lab = Lab::new();
        let ns = lab.add_host(role);
        let (tx, rx) = mpsc::channel::<Drift>();
        let monitor = ns
            .enter(move || Monitor::start_with(TABLE_NAME, rcvbuf, move |d| tx.send(d).is_ok()))
            .expect("monitor");
        Monitored {
            ns,
            monitor,
            rx,
            _lab: lab,
            _alone,
        }
    }
}
