//! The node network of a local ring: one namespace per node on a bridge, and a
//! forwarder that lets a node reach its shoot's API on the host's loopback.
//!
//! ```text
//!   root namespace (ringd, control planes on 127.x)   hub namespace rnode-T-hub: bridge br0
//!   rnTh 198.19.16T.254 ──veth── root ─┐
//!                                      ├── br0 ──┬── p1 ──veth── eth0 198.19.16T.1  node m1 (rnode-T-m1), pods 198.19.(16T+1).0/24
//!                                      │         └── p2 ──veth── eth0 198.19.16T.2  node m2 (rnode-T-m2), pods 198.19.(16T+2).0/24
//! ```
//!
//! Routes: the root namespace reaches every pod range through its node; each
//! node reaches the other nodes' pod ranges directly over the bridge and
//! everything else through the root namespace, but for link-local addresses
//! (cloud metadata), which fail at once. 198.19.0.0/16 is a benchmark
//! range (RFC 2544), never routed on a real network; T (0..=15) keeps rings on
//! one machine apart, and the drills' 198.18.0.0/16 stays theirs.

use std::net::{Ipv4Addr, SocketAddr};

use tokio_util::sync::CancellationToken;

use crate::error::{Result, SeedError};
use crate::netns::{exists, ip};

/// Link-local addresses (cloud metadata services at 169.254.169.254): no
/// node reaches them.
pub const LINK_LOCAL: &str = "169.254.0.0/16";

/// The machine's resolver configuration, which the nodes' processes read.
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The IPv4 name servers of a `resolv.conf` a node cannot reach: all but
/// loopback addresses (those are the node's own loopback in its namespace,
/// refused at once).
pub fn name_servers(resolv_conf: &str) -> Vec<Ipv4Addr> {
    resolv_conf
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next())?
        })
        .filter_map(|a| a.parse::<Ipv4Addr>().ok())
        .filter(|a| !a.is_loopback())
        .collect()
}

/// At most this many nodes on one node network (pod ranges T*16+1 ..= T*16+15).
pub const MAX_NODES: usize = 15;

/// One node's place on the node network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHost {
    pub name: String,
    /// Its `ip netns` namespace.
    pub netns: String,
    pub address: Ipv4Addr,
    /// Its pods' range.
    pub pod_cidr: String,
}

/// The node network with tag `tag`: names and addresses, no side effects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNetwork {
    pub tag: u8,
    pub hosts: Vec<NodeHost>,
}

impl NodeNetwork {
    /// The plan for `nodes` (in order) on tag `tag` (0..=15).
    pub fn plan(tag: u8, nodes: &[String]) -> Result<NodeNetwork> {
        if tag > 15 {
            return Err(SeedError::InvalidSpec {
                field: "node network tag".into(),
                reason: format!("{tag} is not in 0..=15"),
            });
        }
        if nodes.len() > MAX_NODES {
            return Err(SeedError::InvalidSpec {
                field: "nodes".into(),
                reason: format!(
                    "{} nodes; a node network has room for {MAX_NODES}",
                    nodes.len()
                ),
            });
        }
        let hosts = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeHost {
                name: n.clone(),
                netns: format!("rnode-{tag}-{n}"),
                address: Ipv4Addr::new(198, 19, tag * 16, (i + 1) as u8),
                pod_cidr: format!("198.19.{}.0/24", tag * 16 + 1 + i as u8),
            })
            .collect();
        Ok(NodeNetwork { tag, hosts })
    }

    /// The first tag whose hub namespace does not exist, preferring `preferred`.
    pub fn free_tag(preferred: Option<u8>) -> Result<u8> {
        if let Some(t) = preferred.filter(|t| *t <= 15) {
            if !exists(&hub_name(t)) {
                return Ok(t);
            }
        }
        (0..=15u8)
            .find(|t| !exists(&hub_name(*t)))
            .ok_or_else(|| SeedError::Network {
                command: "choosing a node network".into(),
                reason: "all 16 node networks (rnode-0-hub .. rnode-15-hub) exist; `ringctl down` rings you no longer need".into(),
            })
    }

    /// Creates a node network for `nodes` on a tag nobody holds. Creating the hub
    /// namespace is the claim (it fails if the name exists), so concurrent callers
    /// never end up on one tag.
    pub fn create(nodes: &[String]) -> Result<NodeNetwork> {
        for tag in 0..=15u8 {
            let net = NodeNetwork::plan(tag, nodes)?;
            let hub = net.hub();
            if exists(&hub) {
                continue;
            }
            match ip(&["netns", "add", &hub]) {
                Err(_) if exists(&hub) => continue, // claimed by someone else meanwhile
                Err(e) => return Err(e),
                Ok(()) => {}
            }
            let gateway = format!("{}/24", net.gateway());
            let made =
                crate::netns::setup_hub(&hub, &net.root_if(), &gateway).and_then(|()| net.ensure());
            if let Err(e) = made {
                let _ = net.remove();
                return Err(e);
            }
            return Ok(net);
        }
        Err(SeedError::Network {
            command: "choosing a node network".into(),
            reason: "all 16 node networks (rnode-0-hub .. rnode-15-hub) exist; `ringctl down` rings you no longer need".into(),
        })
    }

    /// The hub namespace's name.
    pub fn hub(&self) -> String {
        hub_name(self.tag)
    }

    /// The root namespace's address on the node network (every node's gateway).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, self.tag * 16, 254)
    }

    /// Every pod range of this network (kube-proxy's cluster CIDR).
    pub fn cluster_cidr(&self) -> String {
        format!("198.19.{}.0/20", self.tag * 16)
    }

    fn root_if(&self) -> String {
        format!("rn{}h", self.tag)
    }

    /// Creates what is missing (idempotent): hub, bridge, the root link, each
    /// node's namespace with its address and routes.
    pub fn ensure(&self) -> Result<()> {
        let hub = self.hub();
        if !exists(&hub) {
            let gateway = format!("{}/24", self.gateway());
            crate::netns::create_hub(&hub, &self.root_if(), &gateway)?;
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if !exists(&h.netns) {
                self.add_host(i, h)?;
            }
            // the cloud metadata address fails at once instead of going out
            // through the root namespace, where nothing answers: kubelet's
            // AWS credential provider otherwise waits ~6 s on it at every start
            ip(&[
                "-n",
                &h.netns,
                "route",
                "replace",
                "unreachable",
                LINK_LOCAL,
            ])?;
            // the same for the machine's name servers, which no node reaches
            // (its processes resolve names with the machine's resolv.conf):
            // kubelet's cloud detection otherwise waits 5 s for
            // metadata.google.internal before it registers the node
            for server in name_servers(&std::fs::read_to_string(RESOLV_CONF).unwrap_or_default()) {
                let server = format!("{server}/32");
                ip(&["-n", &h.netns, "route", "replace", "unreachable", &server])?;
            }
            // the root namespace reaches the node's pods through the node
            ip(&[
                "route",
                "replace",
                &h.pod_cidr,
                "via",
                &h.address.to_string(),
            ])?;
        }
        Ok(())
    }

    fn add_host(&self, i: usize, h: &NodeHost) -> Result<()> {
        let hub = self.hub();
        let port = format!("p{}", i + 1);
        crate::netns::attach(&hub, &port, &h.netns, &format!("{}/24", h.address))?;
        ip(&[
            "-n",
            &h.netns,
            "route",
            "add",
            "default",
            "via",
            &self.gateway().to_string(),
        ])?;
        for other in self.hosts.iter().filter(|o| o.name != h.name) {
            ip(&[
                "-n",
                &h.netns,
                "route",
                "add",
                &other.pod_cidr,
                "via",
                &other.address.to_string(),
            ])?;
        }
        Ok(())
    }

    /// Plugs the existing namespace `netns` (a host that is not a node, e.g. a
    /// drill member whose ringd uses this network's nodes) into the bridge as
    /// guest `i` (0..=49): interface `node0` with address 198.19.16T.(200+i),
    /// which reaches every node directly. Deleting `netns` removes the link.
    pub fn plug_guest(&self, netns: &str, i: u8) -> Result<Ipv4Addr> {
        if i >= 50 {
            return Err(SeedError::InvalidSpec {
                field: "node network guest".into(),
                reason: format!("{i} is not in 0..=49"),
            });
        }
        let address = Ipv4Addr::new(198, 19, self.tag * 16, 200 + i);
        crate::netns::plug(
            &self.hub(),
            &format!("g{i}"),
            netns,
            "node0",
            &format!("{address}/24"),
        )?;
        Ok(address)
    }

    /// [`plug_guest`](Self::plug_guest) unless `netns` is plugged in already
    /// (it has the guest interface): a rerun never cuts a running guest off.
    pub fn ensure_guest(&self, netns: &str, i: u8) -> Result<()> {
        if !has_guest_link(netns) {
            self.plug_guest(netns, i)?;
        }
        Ok(())
    }

    /// Deletes every namespace and link of this network (what is gone is skipped).
    pub fn remove(&self) -> Result<()> {
        let mut first_err = None;
        for h in &self.hosts {
            let _ = ip(&["route", "del", &h.pod_cidr]);
            if exists(&h.netns) {
                if let Err(e) = ip(&["netns", "del", &h.netns]) {
                    first_err.get_or_insert(e);
                }
            }
        }
        let _ = ip(&["link", "del", &self.root_if()]);
        if exists(&self.hub()) {
            if let Err(e) = ip(&["netns", "del", &self.hub()]) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Whether namespace `netns` has the guest interface of a node network.
pub fn has_guest_link(netns: &str) -> bool {
    exists(netns) && ip(&["-n", netns, "link", "show", "node0"]).is_ok()
}

fn hub_name(tag: u8) -> String {
    format!("rnode-{tag}-hub")
}

/// Forwards connections to `listen` inside namespace `netns` to `addr` in this
/// process's own namespace (the host's loopback, where the shoot's API
/// listens), until `stop`. With `listen` = `addr` the node reaches its shoot at
/// the same address and with the same certificate as every other client.
pub async fn forward_into(
    netns: &str,
    listen: SocketAddr,
    addr: SocketAddr,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>> {
    let std_listener = crate::netns::listen_in(netns, listen).map_err(|e| SeedError::Node {
        node: netns.to_string(),
        reason: format!("listening on {listen} inside network namespace {netns}: {e}"),
    })?;
    let listener =
        tokio::net::TcpListener::from_std(std_listener).map_err(|e| SeedError::Node {
            node: netns.to_string(),
            reason: format!("listening on {listen}: {e}"),
        })?;
    Ok(tokio::spawn(crate::forward::relay(
        listener,
        addr.to_string(),
        stop,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machines_name_servers_except_loopback_and_ipv6() {
        let conf = "# comment\nsearch example.org\nnameserver 10.255.255.53\nnameserver 127.0.0.53\nnameserver ::1\nnameserver\nnameserver 192.0.2.1 # x\noptions ndots:2\n";
        assert_eq!(
            name_servers(conf),
            [Ipv4Addr::new(10, 255, 255, 53), Ipv4Addr::new(192, 0, 2, 1)]
        );
        assert!(name_servers("").is_empty());
    }

    #[test]
    fn addresses_and_ranges_follow_the_tag() {
        let net = NodeNetwork::plan(2, &["m1".into(), "m2".into(), "m3".into()]).unwrap();
        assert_eq!(net.gateway(), Ipv4Addr::new(198, 19, 32, 254));
        assert_eq!(net.cluster_cidr(), "198.19.32.0/20");
        assert_eq!(net.hub(), "rnode-2-hub");
        let h = &net.hosts[2];
        assert_eq!(h.netns, "rnode-2-m3");
        assert_eq!(h.address, Ipv4Addr::new(198, 19, 32, 3));
        assert_eq!(h.pod_cidr, "198.19.35.0/24");
        let names: Vec<String> = (0..16).map(|i| format!("n{i}")).collect();
        assert!(NodeNetwork::plan(0, &names).is_err());
        assert!(NodeNetwork::plan(16, &names[..1]).is_err());
    }

    /// Needs root (as CI and the drills do): a real node network with one
    /// node, and a guest namespace plugged into it that reaches the node's
    /// address directly, as a drill member's ringd reaches its node ports.
    #[test]
    fn a_guest_namespace_reaches_the_nodes_on_its_own_link() {
        let net = NodeNetwork::create(&["guestnode".to_string()])
            .expect("creating a node network (needs root; run the tests as root)");
        let guest = format!("rnode-{}-guest", net.tag);
        let outcome = (|| -> std::result::Result<(), String> {
            crate::netns::ip(&["netns", "add", &guest]).map_err(|e| e.to_string())?;
            let node = net.hosts[0].clone();
            let listener = crate::netns::listen_in(&node.netns, (node.address, 7101).into())
                .map_err(|e| format!("listening in the node: {e}"))?;
            // before plugging, the guest has no route to the node
            let reach = |ns: String| {
                std::thread::spawn(move || {
                    crate::netns::enter(&ns)?;
                    std::net::TcpStream::connect_timeout(
                        &(node.address, 7101).into(),
                        std::time::Duration::from_secs(2),
                    )
                })
                .join()
                .map_err(|_| "the connecting thread panicked".to_string())
            };
            if reach(guest.clone())?.is_ok() {
                return Err("the guest reached the node before it was plugged in".into());
            }
            let address = net.plug_guest(&guest, 3).map_err(|e| e.to_string())?;
            if address != Ipv4Addr::new(198, 19, net.tag * 16, 203) {
                return Err(format!("guest 3 got {address}"));
            }
            // a port that just came up may drop the first packets: bounded retries
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                match reach(guest.clone())? {
                    Ok(_) => break,
                    Err(e) if std::time::Instant::now() >= deadline => {
                        return Err(format!("the plugged guest does not reach the node: {e}"))
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
                }
            }
            listener.set_nonblocking(false).map_err(|e| e.to_string())?;
            let (_, from) = listener.accept().map_err(|e| e.to_string())?;
            if from.ip() != std::net::IpAddr::V4(address) {
                return Err(format!("the node saw the guest as {from}, not {address}"));
            }
            Ok(())
        })();
        let _ = crate::netns::ip(&["netns", "del", &guest]);
        let removed = net.remove();
        outcome.unwrap();
        removed.unwrap();
        assert!(!crate::netns::exists(&guest), "{guest} left behind");
    }
}
