//! Stable per-shoot addresses on loopback.
//!
//! Every shoot gets its own `127.x.y.z` address. All components of its control
//! plane listen there on their standard ports, so several control planes run
//! side by side without port collisions, and the API endpoint written into the
//! shoot's kubeconfig stays the same when the control plane moves to another seed.

use std::net::{Ipv4Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::error::{Result, SeedError};

/// The first port of the hot standbys' etcd ports ([`ShootEndpoint::standby_ports`]).
pub const STANDBY_PORT_BASE: u16 = 12400;
/// The first port of the warm kube-apiservers next to hot standbys
/// ([`ShootEndpoint::standby_api_port`]), above every standby etcd port.
pub const STANDBY_API_PORT_BASE: u16 = 14400;
/// Every hot standby's etcd (client, peer) port: two per member id below 1000.
pub const STANDBY_ETCD_PORTS: std::ops::Range<u16> = STANDBY_PORT_BASE..STANDBY_PORT_BASE + 2000;
/// Every warm kube-apiserver's secure port: one per member id below 1000.
pub const STANDBY_API_PORTS: std::ops::Range<u16> =
    STANDBY_API_PORT_BASE..STANDBY_API_PORT_BASE + 1000;

/// Whether `port` is one of the hot standbys' on a shoot's address (etcd
/// client and peer ports, warm kube-apiservers' secure ports).
pub fn is_standby_port(port: u16) -> bool {
    STANDBY_ETCD_PORTS.contains(&port) || STANDBY_API_PORTS.contains(&port)
}

/// Where a shoot's control plane listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShootEndpoint {
    /// The shoot's own loopback address; every component binds to it.
    pub address: Ipv4Addr,
    /// kube-apiserver's secure port (the API endpoint clients use).
    pub api_port: u16,
    /// etcd's client port (TLS).
    pub etcd_client_port: u16,
    /// etcd's peer port (TLS).
    pub etcd_peer_port: u16,
    /// kube-controller-manager's secure (health) port.
    pub controller_manager_port: u16,
    /// kube-scheduler's secure (health) port.
    pub scheduler_port: u16,
}

impl ShootEndpoint {
    /// Standard ports on the given address.
    pub fn on(address: Ipv4Addr) -> Self {
        ShootEndpoint {
            address,
            api_port: 6443,
            etcd_client_port: 2379,
            etcd_peer_port: 2380,
            controller_manager_port: 10257,
            scheduler_port: 10259,
        }
    }

    /// The default endpoint of a shoot: a loopback address derived from its name
    /// (stable across runs and seeds), never 127.0.0.x, with standard ports.
    pub fn for_shoot(shoot: &str) -> Self {
        // FNV-1a: tiny, stable across Rust versions (unlike DefaultHasher).
        let mut h: u64 = 0xcbf29ce484222325;
        for b in shoot.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
        let a = 10 + (h % 200) as u8; // 127.10.0.0 – 127.209.255.255
        let b = ((h >> 16) & 0xff) as u8;
        let c = 1 + ((h >> 32) % 254) as u8; // never .0 or .255
        ShootEndpoint::on(Ipv4Addr::new(127, a, b, c))
    }

    /// `https://ADDR:PORT` of the kube-apiserver.
    pub fn api_url(&self) -> String {
        format!("https://{}:{}", self.address, self.api_port)
    }

    /// `https://ADDR:PORT` of etcd's client listener.
    pub fn etcd_url(&self) -> String {
        format!("https://{}:{}", self.address, self.etcd_client_port)
    }

    /// `https://ADDR:PORT` of etcd's peer listener.
    pub fn etcd_peer_url(&self) -> String {
        format!("https://{}:{}", self.address, self.etcd_peer_port)
    }

    /// etcd's (client, peer) ports of a hot standby on the seed of member
    /// `slot` (its Raft id): on the shoot's address like the serving
    /// control plane, apart from its ports, so the two can share a machine;
    /// distinct per member (ids below 1000 never collide).
    pub fn standby_ports(&self, slot: u64) -> (u16, u16) {
        let base = STANDBY_PORT_BASE + 2 * (slot % 1000) as u16;
        (base, base + 1)
    }

    /// The secure port of the warm kube-apiserver next to the hot standby on
    /// the seed of member `slot` (see [`ShootEndpoint::standby_ports`]).
    pub fn standby_api_port(&self, slot: u64) -> u16 {
        STANDBY_API_PORT_BASE + (slot % 1000) as u16
    }

    /// Every socket a control plane listens on, with the component that owns it.
    pub fn sockets(&self) -> [(&'static str, SocketAddr); 5] {
        let at = |p| SocketAddr::from((self.address, p));
        [
            ("etcd (client)", at(self.etcd_client_port)),
            ("etcd (peer)", at(self.etcd_peer_port)),
            ("kube-apiserver", at(self.api_port)),
            ("kube-controller-manager", at(self.controller_manager_port)),
            ("kube-scheduler", at(self.scheduler_port)),
        ]
    }

    /// Checks the endpoint is usable: a loopback address and five distinct non-zero ports.
    pub fn validate(&self) -> Result<()> {
        if !self.address.is_loopback() {
            return Err(SeedError::InvalidSpec {
                field: "endpoint.address".into(),
                reason: format!(
                    "{} is not in 127.0.0.0/8; local seeds serve shoots on loopback addresses",
                    self.address
                ),
            });
        }
        let ports = self.sockets().map(|(_, s)| s.port());
        for (i, p) in ports.iter().enumerate() {
            if STANDBY_ETCD_PORTS.contains(p) {
                return Err(SeedError::InvalidSpec {
                    field: "endpoint ports".into(),
                    reason: format!(
                        "port {p} is among the hot standbys' etcd ports {STANDBY_PORT_BASE}-{}; choose another",
                        STANDBY_ETCD_PORTS.end - 1
                    ),
                });
            }
            if *p == 0 || ports[..i].contains(p) {
                return Err(SeedError::InvalidSpec {
                    field: "endpoint ports".into(),
                    reason: format!("port {p} is zero or used twice in {ports:?}"),
                });
            }
        }
        Ok(())
    }
}

/// Checks that `name` can name a shoot: a DNS-1123 label of at most 40 characters
/// (it becomes part of namespaces, certificate names and file paths).
pub fn validate_shoot_name(name: &str) -> Result<()> {
    let bad = |reason: &str| {
        Err(SeedError::InvalidSpec {
            field: "shoot name".into(),
            reason: format!("{name:?} {reason}"),
        })
    };
    if name.is_empty() || name.len() > 40 {
        return bad("must have 1 to 40 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return bad("may contain only lowercase letters, digits and '-'");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return bad("must start and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_address_is_stable_loopback_and_not_127_0_0() {
        let e = ShootEndpoint::for_shoot("alpha");
        assert_eq!(e, ShootEndpoint::for_shoot("alpha"));
        assert!(e.address.is_loopback());
        let o = e.address.octets();
        assert!(o[1] >= 10 && o[3] != 0 && o[3] != 255, "{e:?}");
        assert_ne!(e.address, ShootEndpoint::for_shoot("beta").address);
        e.validate().unwrap();
    }

    #[test]
    fn names_are_validated() {
        for ok in ["a", "shoot-1", "x0"] {
            validate_shoot_name(ok).unwrap();
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"x".repeat(41)] {
            let err = validate_shoot_name(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid shoot name"), "{err}");
        }
    }

    #[test]
    fn endpoint_validation_rejects_non_loopback_and_duplicate_ports() {
        let mut e = ShootEndpoint::on(Ipv4Addr::new(10, 0, 0, 1));
        assert!(e
            .validate()
            .unwrap_err()
            .to_string()
            .contains("127.0.0.0/8"));
        e = ShootEndpoint::on(Ipv4Addr::new(127, 1, 2, 3));
        e.scheduler_port = e.api_port;
        assert!(e.validate().unwrap_err().to_string().contains("used twice"));
    }
}
