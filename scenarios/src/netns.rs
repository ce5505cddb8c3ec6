//! Members in their own network namespaces on one machine, so a drill can cut a
//! member off from the others with `ip` (a real partition, not a paused process).
//!
//! ```text
//!   root namespace (runner, ringctl)          hub namespace: bridge br0
//!   rgNh 198.18.N.254 ──veth── root ─┐
//!                                    ├── br0 ──┬── p1 ──veth── eth0 198.18.N.1  (member 1's namespace)
//!                                    │         ├── p2 ──veth── eth0 198.18.N.2  (member 2's namespace)
//!                                    │         └── p3 ──veth── eth0 198.18.N.3  (member 3's namespace)
//! ```
//!
//! Member i's ringd listens on 198.18.N.i; the control planes it hosts bind their
//! shoot's 127.x address on the namespace's own loopback, so they are reachable
//! only inside it. The runner reaches a shoot's API through a [`Forwarder`]: it
//! listens on the shoot's endpoint in the root namespace and, per connection,
//! connects to that endpoint inside whichever member namespace accepts (a load
//! balancer in front of the seeds). Cutting member i = `ip link set pi down` in
//! the hub; the forwarder still reaches it, as clients of a partitioned seed
//! might, which is what fencing has to cope with.
//!
//! The bridge lives in its own namespace so the host's firewall (e.g. a
//! `FORWARD DROP` policy with `bridge-nf-call-iptables`) never sees the traffic.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use seed::netns::enter;
use tokio_util::sync::CancellationToken;

use crate::ScenarioError;

fn setup_err(what: impl Into<String>) -> ScenarioError {
    ScenarioError::Setup(what.into())
}

/// Runs `ip ARGS` (the seed crate's helper), as a setup error of the drill.
fn ip(args: &[&str]) -> Result<(), ScenarioError> {
    seed::netns::ip(args).map_err(|e| setup_err(e.to_string()))
}

/// What a connect request carries: where to, and where the socket goes.
type ConnectRequest = (
    SocketAddr,
    tokio::sync::oneshot::Sender<std::io::Result<std::net::TcpStream>>,
);

/// A thread that lives in one network namespace and opens TCP connections there
/// (a socket belongs to the namespace of the thread that created it).
struct Connector {
    tx: Mutex<mpsc::Sender<ConnectRequest>>,
}

impl Connector {
    fn start(netns: &str) -> Result<Connector, ScenarioError> {
        let (tx, rx) = mpsc::channel::<ConnectRequest>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let ns = netns.to_string();
        std::thread::Builder::new()
            .name(format!("netns-{netns}"))
            .spawn(move || {
                let entered = enter(&ns);
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if !ok {
                    return;
                }
                // ends when the Connector (the only sender) is dropped
                for (addr, reply) in rx {
                    let _ = reply.send(std::net::TcpStream::connect_timeout(
                        &addr,
                        Duration::from_millis(300),
                    ));
                }
            })
            .map_err(|e| setup_err(format!("starting a thread for {netns}: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Connector { tx: Mutex::new(tx) }),
            Ok(Err(e)) => Err(setup_err(format!(
                "entering network namespace {netns}: {e}"
            ))),
            Err(_) => Err(setup_err(format!("the thread for {netns} died"))),
        }
    }

    async fn connect(&self, addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send((addr, reply));
        if sent.is_err() {
            return Err(std::io::Error::other("connector stopped"));
        }
        let stream = rx
            .await
            .map_err(|_| std::io::Error::other("connector stopped"))??;
        stream.set_nonblocking(true)?;
        tokio::net::TcpStream::from_std(stream)
    }
}

/// One member's place on the drill's network.
#[derive(Debug, Clone)]
pub struct Host {
    pub member: String,
    /// Its network namespace (`ip netns` name).
    pub netns: String,
    /// Its port on the hub's bridge (cut to partition it).
    pub port: String,
    pub address: Ipv4Addr,
}

/// The drill's network: a hub namespace with a bridge, one namespace per member,
/// and a link from the root namespace. Everything is deleted on drop.
pub struct Network {
    tag: u8,
    hub: String,
    root_if: String,
    hosts: Vec<Host>,
    connectors: BTreeMap<String, Arc<Connector>>,
    cut: Mutex<Vec<String>>,
}

impl Network {
    /// Creates the namespaces and links for `members`; `tag` (0..=255) keeps
    /// concurrent drills apart (another free tag is taken if it is in use).
    pub fn create(members: &[String], tag: u8) -> Result<Network, ScenarioError> {
        let tag = (0..=255u16)
            .map(|i| ((u16::from(tag) + i) % 256) as u8)
            .find(|t| !std::path::Path::new(&format!("/run/netns/ring-{t}-hub")).exists())
            .ok_or_else(|| setup_err("no free network tag (256 drill networks exist?)"))?;
        let hub = format!("ring-{tag}-hub");
        let mut net = Network {
            tag,
            hub: hub.clone(),
            root_if: format!("rg{tag}h"),
            hosts: Vec::new(),
            connectors: BTreeMap::new(),
            cut: Mutex::new(Vec::new()),
        };
        // on any error below, drop removes what exists so far
        let gateway = format!("{}/24", net.gateway());
        seed::netns::create_hub(&hub, &net.root_if, &gateway)
            .map_err(|e| setup_err(e.to_string()))?;
        for (i, m) in members.iter().enumerate() {
            let host = Host {
                member: m.clone(),
                netns: format!("ring-{tag}-{m}"),
                port: format!("p{}", i + 1),
                address: Ipv4Addr::new(198, 18, tag, (i + 1) as u8),
            };
            // pushed first: drop deletes the namespace even if attaching fails
            net.hosts.push(host.clone());
            let cidr = format!("{}/24", host.address);
            seed::netns::attach(&hub, &host.port, &host.netns, &cidr)
                .map_err(|e| setup_err(e.to_string()))?;
            net.connectors
                .insert(m.clone(), Arc::new(Connector::start(&host.netns)?));
        }
        Ok(net)
    }

    /// The root namespace's address on the drill network.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.tag, 254)
    }

    /// Every member's place, in ring order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    fn host(&self, member: &str) -> Result<&Host, ScenarioError> {
        self.hosts
            .iter()
            .find(|h| h.member == member)
            .ok_or_else(|| setup_err(format!("{member} is not on the drill network")))
    }

    /// Cuts `member` off from every other member and from the runner.
    pub fn cut(&self, member: &str) -> Result<(), ScenarioError> {
        let h = self.host(member)?;
        ip(&["-n", &self.hub, "link", "set", &h.port, "down"])?;
        let mut cut = self.cut.lock().unwrap_or_else(|p| p.into_inner());
        if !cut.contains(&h.member) {
            cut.push(h.member.clone());
        }
        Ok(())
    }

    /// Reconnects every member that was cut; returns their names.
    pub fn heal(&self) -> Result<Vec<String>, ScenarioError> {
        let cut: Vec<String> =
            std::mem::take(&mut *self.cut.lock().unwrap_or_else(|p| p.into_inner()));
        for m in &cut {
            let h = self.host(m)?;
            ip(&["-n", &self.hub, "link", "set", &h.port, "up"])?;
        }
        Ok(cut)
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        format!(
            "network namespaces: each member in its own (ring-{t}-<member>, 198.18.{t}.i) on a bridge in ring-{t}-hub; partitions cut a member's bridge port with `ip link set down`; the runner reaches shoot APIs through a forwarder into the namespace that serves them",
            t = self.tag
        )
    }

    /// Forwards connections to `endpoint` (in the root namespace) to `endpoint`
    /// inside whichever member namespace accepts, until `stop`. `owner`, the
    /// member whose own shoot it is, is asked last: it serves it only while
    /// the bootstrap starts it there (on the self-hosted ring it otherwise
    /// holds a relay of its own, see [`forward_own`](Self::forward_own)).
    pub async fn forward(
        self: &Arc<Self>,
        endpoint: SocketAddr,
        owner: &str,
        stop: CancellationToken,
    ) -> Result<tokio::task::JoinHandle<()>, ScenarioError> {
        let listener = tokio::net::TcpListener::bind(endpoint)
            .await
            .map_err(|e| setup_err(format!("listening on {endpoint} to forward it: {e}")))?;
        Ok(self.relay(listener, endpoint, owner.to_string(), false, stop))
    }

    /// Makes member `owner`'s own shoot endpoint reachable inside its
    /// namespace, as over the network from wherever its control plane runs:
    /// on the self-hosted ring its ringd manages the pods of its successor
    /// through its own shoot's API, which another member serves. It listens
    /// only while `elsewhere` says so (the bootstrap first runs each shoot as
    /// processes on its own member, on this very address). A partition holds:
    /// nothing passes while `owner`, or the member serving, is cut.
    pub fn forward_own(
        self: &Arc<Self>,
        endpoint: SocketAddr,
        owner: &str,
        mut elsewhere: tokio::sync::watch::Receiver<bool>,
        stop: CancellationToken,
    ) -> Result<tokio::task::JoinHandle<()>, ScenarioError> {
        let netns = self.host(owner)?.netns.clone();
        let (net, owner) = (self.clone(), owner.to_string());
        Ok(tokio::spawn(async move {
            let mut preferred = 0usize;
            loop {
                // until the shoot is served elsewhere
                while !*elsewhere.borrow_and_update() {
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => return,
                        changed = elsewhere.changed() => if changed.is_err() { return },
                    }
                }
                // the member's own server may hold the address a little longer
                let Some(listener) = bind_in(&netns, endpoint, &elsewhere, &stop).await else {
                    if stop.is_cancelled() {
                        return;
                    }
                    continue;
                };
                loop {
                    let accepted = tokio::select! {
                        biased;
                        _ = stop.cancelled() => return,
                        changed = elsewhere.changed() => {
                            if changed.is_err() || !*elsewhere.borrow_and_update() {
                                break; // served here again: let the address go
                            }
                            continue;
                        }
                        a = listener.accept() => a,
                    };
                    if let Ok((client, _)) = accepted {
                        net.join(client, endpoint, &owner, true, &mut preferred, &stop)
                            .await;
                    }
                }
            }
        }))
    }

    fn is_cut(&self, member: &str) -> bool {
        self.cut
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|m| m == member)
    }

    /// Accepts on `listener` and [`join`](Self::join)s every client.
    fn relay(
        self: &Arc<Self>,
        listener: tokio::net::TcpListener,
        endpoint: SocketAddr,
        owner: String,
        partitioned: bool,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let net = self.clone();
        tokio::spawn(async move {
            let mut preferred = 0usize;
            loop {
                let accepted = tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((client, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                net.join(client, endpoint, &owner, partitioned, &mut preferred, &stop)
                    .await;
            }
        })
    }

    /// Joins `client` to `endpoint` in the first member namespace that accepts,
    /// trying `preferred` first and `owner`'s last; with `partitioned` (a
    /// relay inside `owner`'s namespace) the bridge's cuts apply and `owner`'s
    /// is never tried. A client nobody takes sees its connection close.
    async fn join(
        &self,
        mut client: tokio::net::TcpStream,
        endpoint: SocketAddr,
        owner: &str,
        partitioned: bool,
        preferred: &mut usize,
        stop: &CancellationToken,
    ) {
        if partitioned && self.is_cut(owner) {
            return;
        }
        let n = self.hosts.len();
        let owner_at = self.hosts.iter().position(|h| h.member == owner);
        // the owner's namespace last, and only from the root namespace: it
        // serves its own shoot only while the bootstrap starts it there, and
        // otherwise holds the relay that brings the shoot to it
        let order = (0..n)
            .map(|k| (*preferred + k) % n)
            .filter(|i| Some(*i) != owner_at)
            .chain(owner_at.filter(|_| !partitioned));
        let mut upstream = None;
        for i in order {
            let member = &self.hosts[i].member;
            if partitioned && self.is_cut(member) {
                continue;
            }
            let Some(c) = self.connectors.get(member) else {
                continue;
            };
            if let Ok(s) = c.connect(endpoint).await {
                *preferred = i;
                upstream = Some(s);
                break;
            }
        }
        let Some(mut upstream) = upstream else {
            return;
        };
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                biased;
                _ = stop.cancelled() => {}
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
            }
        });
    }
}

/// Binds `endpoint` inside `netns`, retrying while the address is taken;
/// `None` once `elsewhere` turns false or `stop` is cancelled.
async fn bind_in(
    netns: &str,
    endpoint: SocketAddr,
    elsewhere: &tokio::sync::watch::Receiver<bool>,
    stop: &CancellationToken,
) -> Option<tokio::net::TcpListener> {
    loop {
        if stop.is_cancelled() || !*elsewhere.borrow() {
            return None;
        }
        if let Ok(l) = seed::netns::listen_in(netns, endpoint) {
            if let Ok(l) = tokio::net::TcpListener::from_std(l) {
                return Some(l);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.connectors.clear();
        // deleting a namespace removes its links (and the root link's peer with the hub)
        for h in &self.hosts {
            let _ = ip(&["netns", "del", &h.netns]);
        }
        let _ = ip(&["netns", "del", &self.hub]);
        let _ = ip(&["link", "del", &self.root_if]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connects through `c` to `addr`, retrying for up to 10 s: a bridge port
    /// that just came up may drop the first packets.
    async fn reach(c: &Connector, addr: SocketAddr, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match c.connect(addr).await {
                Ok(_) => return,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    panic!("{what}: not reachable within 10s: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Needs root (as CI and the drills do): creates a real drill network.
    #[tokio::test]
    async fn a_cut_member_is_unreachable_until_healed_and_the_forwarder_follows_the_server() {
        let members = vec!["nsa1".to_string(), "nsa2".to_string(), "nsa3".to_string()];
        let net =
            Arc::new(Network::create(&members, 201).expect(
                "creating network namespaces (the drills need root; run the tests as root)",
            ));
        // a server in member 2's namespace, on the bridge and on a 127.x address
        let h2 = net.hosts()[1].clone();
        let shoot_ep: SocketAddr = "127.77.0.9:6443".parse().unwrap();
        let (tx, rx) = mpsc::channel::<(std::net::TcpListener, std::net::TcpListener)>();
        let h2_addr = h2.address;
        // bind inside the namespace from a thread that entered it
        let ns = h2.netns.clone();
        std::thread::spawn(move || {
            enter(&ns).unwrap();
            let a = std::net::TcpListener::bind((h2_addr, 7001)).unwrap();
            let b = std::net::TcpListener::bind(shoot_ep).unwrap();
            tx.send((a, b)).unwrap();
        });
        let (on_bridge, on_loopback) = rx.recv().unwrap();
        let (on_bridge, on_loopback) = (
            tokio::net::TcpListener::from_std({
                on_bridge.set_nonblocking(true).unwrap();
                on_bridge
            })
            .unwrap(),
            tokio::net::TcpListener::from_std({
                on_loopback.set_nonblocking(true).unwrap();
                on_loopback
            })
            .unwrap(),
        );
        let to_m2 = SocketAddr::from((h2_addr, 7001));
        let c1 = net.connectors.get("nsa1").unwrap().clone();
        // member 1 reaches member 2 over the bridge, and so does the root namespace
        reach(&c1, to_m2, "m1 -> m2 before the cut").await;
        tokio::net::TcpStream::connect(to_m2)
            .await
            .expect("root -> m2 before the cut");
        let _ = on_bridge.accept().await.unwrap();
        // the shoot endpoint exists only inside m2's namespace
        assert!(c1.connect(shoot_ep).await.is_err(), "m1 has no such server");
        let stop = CancellationToken::new();
        let fwd = net.forward(shoot_ep, "nsa1", stop.clone()).await.unwrap();
        let mut via = tokio::net::TcpStream::connect(shoot_ep).await.unwrap();
        let (mut served, _) = on_loopback.accept().await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        via.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        served.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");

        net.cut("nsa2").unwrap();
        assert!(
            c1.connect(to_m2).await.is_err(),
            "m1 still reaches m2 after the cut"
        );
        assert!(
            tokio::time::timeout(
                Duration::from_secs(1),
                tokio::net::TcpStream::connect(to_m2)
            )
            .await
            .map_or(true, |r| r.is_err()),
            "the root namespace still reaches m2 after the cut"
        );
        assert_eq!(net.heal().unwrap(), vec!["nsa2".to_string()]);
        reach(&c1, to_m2, "m1 -> m2 after healing").await;
        stop.cancel();
        let _ = fwd.await;
        let namespaces: Vec<String> = net.hosts().iter().map(|h| h.netns.clone()).collect();
        drop(via);
        drop(served);
        drop(net);
        for ns in namespaces {
            assert!(
                !std::path::Path::new("/run/netns").join(&ns).exists(),
                "{ns} left behind"
            );
        }
    }

    /// The self-hosted ring's relay of a member's own shoot into its
    /// namespace: it reaches the member serving the shoot, and nothing passes
    /// while either of them is cut off.
    #[tokio::test]
    async fn a_member_reaches_its_own_shoot_elsewhere_unless_either_is_cut() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let members = vec!["nso1".to_string(), "nso2".to_string(), "nso3".to_string()];
        let net = Arc::new(Network::create(&members, 211).expect("creating network namespaces"));
        // nso1's shoot served inside nso2's namespace
        let shoot_ep: SocketAddr = "127.78.0.1:6443".parse().unwrap();
        let server = seed::netns::listen_in(&net.hosts()[1].netns, shoot_ep).unwrap();
        let server = tokio::net::TcpListener::from_std(server).unwrap();
        let c1 = net.connectors.get("nso1").unwrap().clone();
        assert!(c1.connect(shoot_ep).await.is_err(), "no relay yet");
        let stop = CancellationToken::new();
        let (placed, elsewhere) = tokio::sync::watch::channel(false);
        let relay = net
            .forward_own(shoot_ep, "nso1", elsewhere, stop.clone())
            .unwrap();
        // nothing listens while the shoot is (said to be) served in nso1 itself
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            c1.connect(shoot_ep).await.is_err(),
            "no relay while served here"
        );
        placed.send(true).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while c1.connect(shoot_ep).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the relay never listened"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = server.accept().await.unwrap();
        let passes = |c: Arc<Connector>| {
            let server = &server;
            async move {
                let mut client = c.connect(shoot_ep).await.expect("the relay listens");
                client.write_all(b"ping").await.unwrap();
                match tokio::time::timeout(Duration::from_secs(2), server.accept()).await {
                    Ok(Ok((mut served, _))) => {
                        let mut buf = [0u8; 4];
                        served.read_exact(&mut buf).await.unwrap();
                        assert_eq!(&buf, b"ping");
                        true
                    }
                    _ => {
                        let mut buf = [0u8; 1];
                        let n = client.read(&mut buf).await.unwrap_or(0);
                        assert_eq!(n, 0, "a refused client sees its connection close");
                        false
                    }
                }
            }
        };
        assert!(passes(c1.clone()).await, "nso1 reaches its shoot on nso2");
        net.cut("nso1").unwrap();
        assert!(!passes(c1.clone()).await, "nso1 is cut off");
        net.heal().unwrap();
        assert!(passes(c1.clone()).await, "healed");
        net.cut("nso2").unwrap();
        assert!(
            !passes(c1.clone()).await,
            "the member serving it is cut off"
        );
        net.heal().unwrap();
        // served in nso1 again: the relay lets the address go
        placed.send(false).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while seed::netns::listen_in(&net.hosts()[0].netns, shoot_ep).is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the relay kept the address"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
        let _ = relay.await;
    }
}
