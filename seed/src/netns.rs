//! Network namespaces on one machine: the `ip` command and entering a namespace.
//!
//! Nodes (and the drills' members) each live in a namespace of their own, like
//! hosts on a network. Namespaces are named `ip netns` namespaces (files under
//! `/run/netns`), so they outlive the process that made them and `ip -n NAME`
//! reaches them.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Result, SeedError};

/// The file behind the `ip netns` namespace `name`.
pub fn path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Whether the `ip netns` namespace `name` exists.
pub fn exists(name: &str) -> bool {
    path(name).exists()
}

/// Runs `ip ARGS`; a failure quotes the command and what `ip` said.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("ip")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| SeedError::Network {
            command: format!("ip {}", args.join(" ")),
            reason: format!("{e} (install iproute2: run scripts/setup)"),
        })?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let hint = if err.contains("Operation not permitted") || err.contains("Permission denied") {
        " (network namespaces need root or CAP_SYS_ADMIN + CAP_NET_ADMIN)"
    } else {
        ""
    };
    Err(SeedError::Network {
        command: format!("ip {}", args.join(" ")),
        reason: format!("{err}{hint}"),
    })
}

/// Moves the calling thread into the namespace `name`; sockets it creates from
/// then on belong to that namespace.
pub fn enter(name: &str) -> std::io::Result<()> {
    let file = std::fs::File::open(path(name))?;
    // SAFETY: setns affects this thread only; the fd is open for the call.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Binds a TCP listener inside namespace `name` (from a short-lived thread, so
/// the caller's own threads stay where they are).
pub fn listen_in(name: &str, addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let ns = name.to_string();
    std::thread::Builder::new()
        .name(format!("listen-{name}"))
        .spawn(move || -> std::io::Result<std::net::TcpListener> {
            enter(&ns)?;
            let l = std::net::TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            Ok(l)
        })?
        .join()
        .map_err(|_| std::io::Error::other("the listening thread panicked"))?
}

/// Creates namespace `hub` holding bridge `br0`, linked to the root namespace by
/// a veth whose root end is `root_if` with address `gateway_cidr` (e.g.
/// `198.19.0.254/24`): the network that hosts in namespaces are plugged into.
pub fn create_hub(hub: &str, root_if: &str, gateway_cidr: &str) -> Result<()> {
    ip(&["netns", "add", hub])?;
    setup_hub(hub, root_if, gateway_cidr)
}

/// [`create_hub`] for a hub namespace that already exists (just created by the
/// caller, e.g. as an atomic claim of its name).
pub fn setup_hub(hub: &str, root_if: &str, gateway_cidr: &str) -> Result<()> {
    ip(&["-n", hub, "link", "set", "lo", "up"])?;
    ip(&["-n", hub, "link", "add", "br0", "type", "bridge"])?;
    ip(&["-n", hub, "link", "set", "br0", "up"])?;
    let _ = ip(&["link", "del", root_if]);
    ip(&[
        "link", "add", root_if, "type", "veth", "peer", "name", "root", "netns", hub,
    ])?;
    ip(&["-n", hub, "link", "set", "root", "master", "br0", "up"])?;
    ip(&["addr", "add", gateway_cidr, "dev", root_if])?;
    ip(&["link", "set", root_if, "up"])
}

/// Creates namespace `netns` whose `eth0` (address `cidr`) is plugged into the
/// bridge of `hub` as port `port` (cutting that port partitions the host).
pub fn attach(hub: &str, port: &str, netns: &str, cidr: &str) -> Result<()> {
    ip(&["netns", "add", netns])?;
    ip(&["-n", netns, "link", "set", "lo", "up"])?;
    plug(hub, port, netns, "eth0", cidr)
}

/// Plugs the existing namespace `netns` into the bridge of `hub` as port
/// `port`: a second network for a host that has one, its interface `ifname`
/// with address `cidr`. Deleting either namespace removes the link.
pub fn plug(hub: &str, port: &str, netns: &str, ifname: &str, cidr: &str) -> Result<()> {
    let _ = ip(&["-n", hub, "link", "del", port]);
    ip(&[
        "-n", hub, "link", "add", port, "type", "veth", "peer", "name", ifname, "netns", netns,
    ])?;
    ip(&["-n", hub, "link", "set", port, "master", "br0", "up"])?;
    ip(&["-n", netns, "addr", "add", cidr, "dev", ifname])?;
    ip(&["-n", netns, "link", "set", ifname, "up"])
}

/// Binds a UDP socket inside namespace `name` (from a short-lived thread).
pub fn udp_in(name: &str, addr: std::net::SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let ns = name.to_string();
    std::thread::Builder::new()
        .name(format!("udp-{name}"))
        .spawn(move || -> std::io::Result<std::net::UdpSocket> {
            enter(&ns)?;
            std::net::UdpSocket::bind(addr)
        })?
        .join()
        .map_err(|_| std::io::Error::other("the binding thread panicked"))?
}
