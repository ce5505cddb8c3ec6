//! Cluster DNS for a node's pods: `<service>.<namespace>.svc.<domain>` and
//! `<hostname>.<service>.<namespace>.svc.<domain>` (StatefulSet pods behind a
//! headless Service), answered from the shoot's Services and Endpoints.
//!
//! No CoreDNS image can be had here (no registry, not in Debian), so each
//! `ring-node` answers on its node's address, port 53 (UDP), and kubelet points
//! pods at it (`clusterDNS`). Records come from listing Services and Endpoints
//! every 2 s with kube-proxy's credentials (`system:node-proxier` may list
//! both); the last good records keep being served while the API is away. Names
//! outside the cluster domain are REFUSED: there is no upstream network here.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use tokio_util::sync::CancellationToken;

/// Seconds clients may cache an answer.
const TTL: u32 = 5;

/// What the DNS answers: lowercase names without the trailing dot → addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Records {
    /// The cluster domain (`cluster.local`).
    pub domain: String,
    names: BTreeMap<String, Vec<Ipv4Addr>>,
}

impl Records {
    /// The records of `services` and their `endpoints` under `domain`.
    pub fn new(domain: &str, services: &[Service], endpoints: &[Endpoints]) -> Records {
        let mut names: BTreeMap<String, Vec<Ipv4Addr>> = BTreeMap::new();
        let key = |ns: &str, name: &str| format!("{name}.{ns}.svc.{domain}").to_lowercase();
        let mut headless = Vec::new();
        for s in services {
            let (Some(ns), Some(name)) = (&s.metadata.namespace, &s.metadata.name) else {
                continue;
            };
            match s.spec.as_ref().and_then(|spec| spec.cluster_ip.as_deref()) {
                Some("None") => headless.push(key(ns, name)),
                Some(ip) => {
                    if let Ok(ip) = ip.parse() {
                        names.insert(key(ns, name), vec![ip]);
                    }
                }
                None => {}
            }
        }
        for e in endpoints {
            let (Some(ns), Some(name)) = (&e.metadata.namespace, &e.metadata.name) else {
                continue;
            };
            let service = key(ns, name);
            let ready = e
                .subsets
                .iter()
                .flatten()
                .flat_map(|s| s.addresses.iter().flatten());
            for a in ready {
                let Ok(ip) = a.ip.parse::<Ipv4Addr>() else {
                    continue;
                };
                if headless.contains(&service) {
                    names.entry(service.clone()).or_default().push(ip);
                }
                if let Some(host) = &a.hostname {
                    let host = format!("{}.{service}", host.to_lowercase());
                    names.entry(host).or_default().push(ip);
                }
            }
        }
        Records {
            domain: domain.to_lowercase(),
            names,
        }
    }

    /// The addresses of `name` (any case, with or without the trailing dot):
    /// `None` outside the cluster domain, `Some(empty)` for an unknown name in it.
    pub fn lookup(&self, name: &str) -> Option<&[Ipv4Addr]> {
        let name = name.trim_end_matches('.').to_lowercase();
        let in_domain = name == self.domain || name.ends_with(&format!(".{}", self.domain));
        if !in_domain {
            return None;
        }
        Some(self.names.get(&name).map(Vec::as_slice).unwrap_or(&[]))
    }

    fn knows(&self, name: &str) -> bool {
        self.lookup(name).is_some_and(|a| !a.is_empty())
    }
}

/// The answer to the DNS message `query` (bytes), or `None` when it cannot
/// even be parsed far enough to answer (it is dropped).
pub fn answer(records: &Records, query: &[u8]) -> Option<Vec<u8>> {
    let Ok(request) = Message::from_vec(query) else {
        // at least echo the id with FORMERR when there is a header
        let id = u16::from_be_bytes([*query.first()?, *query.get(1)?]);
        return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
            .to_vec()
            .ok();
    };
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    let Some(q) = request.queries.first().cloned() else {
        response.metadata.response_code = ResponseCode::FormErr;
        return response.to_vec().ok();
    };
    response.add_query(q.clone());
    let name = q.name().to_ascii();
    response.metadata.response_code = match records.lookup(&name) {
        None => ResponseCode::Refused,
        Some(_) if !records.knows(&name) => ResponseCode::NXDomain,
        Some(addresses) => {
            if q.query_type() == RecordType::A {
                for ip in addresses {
                    let rdata = RData::A(A(*ip));
                    response.add_answer(Record::from_rdata(q.name().clone(), TTL, rdata));
                }
            }
            ResponseCode::NoError
        }
    };
    response.metadata.authoritative = response.metadata.response_code != ResponseCode::Refused;
    response.to_vec().ok()
}

/// Answers DNS queries on `socket` (bound by the caller, inside the node's
/// namespace) from `records` until `stop`.
pub async fn serve_udp(
    socket: std::net::UdpSocket,
    records: Arc<RwLock<Records>>,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    socket.set_nonblocking(true)?;
    let socket = tokio::net::UdpSocket::from_std(socket)?;
    Ok(tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, from) = tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                r = socket.recv_from(&mut buf) => match r {
                    Ok(x) => x,
                    Err(_) => continue,
                },
            };
            let reply = {
                let records = records.read().unwrap_or_else(|p| p.into_inner());
                answer(&records, &buf[..n])
            };
            if let Some(reply) = reply {
                let _ = socket.send_to(&reply, from).await;
            }
        }
    }))
}

/// What the DNS asks the shoot with, read again when `renewed` changes.
pub struct Credentials {
    /// The node (for error messages).
    pub node: String,
    /// kube-proxy's kubeconfig.
    pub kubeconfig: std::path::PathBuf,
    /// Changes when kube-proxy's certificate was renewed.
    pub renewed: tokio::sync::watch::Receiver<()>,
}

/// Keeps `records` current from the shoot's Services and Endpoints (every 2 s,
/// keeping the last good ones while the API does not answer) until `stop`.
pub async fn refresh(
    client: kube::Client,
    mut credentials: Credentials,
    records: Arc<RwLock<Records>>,
    stop: CancellationToken,
) {
    let mut services: kube::Api<Service> = kube::Api::all(client.clone());
    let mut endpoints: kube::Api<Endpoints> = kube::Api::all(client);
    let mut failing = false;
    loop {
        if credentials.renewed.has_changed().unwrap_or(false) {
            match crate::kubeconfig::client(&credentials.node, &credentials.kubeconfig).await {
                Ok(client) => {
                    // only once taken: a failed read is tried again next round
                    credentials.renewed.mark_unchanged();
                    services = kube::Api::all(client.clone());
                    endpoints = kube::Api::all(client);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cluster DNS: cannot read the renewed credentials; asking with the old ones")
                }
            }
        }
        let lp = kube::api::ListParams::default();
        match tokio::try_join!(services.list(&lp), endpoints.list(&lp)) {
            Ok((s, e)) => {
                let domain = records
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .domain
                    .clone();
                let fresh = Records::new(&domain, &s.items, &e.items);
                *records.write().unwrap_or_else(|p| p.into_inner()) = fresh;
                failing = false;
            }
            Err(e) if !failing => {
                tracing::warn!(error = %e, "cluster DNS: cannot list Services/Endpoints; serving the last records");
                failing = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// Parses a name for tests and callers that build queries.
pub fn name(s: &str) -> Option<Name> {
    Name::from_str(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, ServiceSpec};
    use kube::api::ObjectMeta;

    fn meta(ns: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            ..Default::default()
        }
    }

    fn service(ns: &str, name: &str, ip: &str) -> Service {
        Service {
            metadata: meta(ns, name),
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn endpoints(ns: &str, name: &str, addrs: &[(&str, Option<&str>)]) -> Endpoints {
        Endpoints {
            metadata: meta(ns, name),
            subsets: Some(vec![EndpointSubset {
                addresses: Some(
                    addrs
                        .iter()
                        .map(|(ip, host)| EndpointAddress {
                            ip: ip.to_string(),
                            hostname: host.map(String::from),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }]),
        }
    }

    fn records() -> Records {
        Records::new(
            "cluster.local",
            &[
                service("ns1", "etcd-client", "10.0.0.20"),
                service("ns1", "etcd", "None"),
            ],
            &[
                endpoints("ns1", "etcd-client", &[("198.19.1.5", None)]),
                endpoints("ns1", "etcd", &[("198.19.1.5", Some("etcd-0"))]),
            ],
        )
    }

    fn ask(name: &str, t: RecordType) -> Message {
        let mut q = Message::query();
        q.metadata.id = 4242;
        q.add_query(Query::query(super::name(name).unwrap(), t));
        let reply = answer(&records(), &q.to_vec().unwrap()).expect("an answer");
        let m = Message::from_vec(&reply).unwrap();
        assert_eq!(m.metadata.id, 4242);
        m
    }

    fn addresses(m: &Message) -> Vec<String> {
        m.answers.iter().map(|r| r.data.to_string()).collect()
    }

    #[test]
    fn answers_services_headless_services_and_statefulset_pods() {
        let cases: Vec<(&str, RecordType, ResponseCode, Vec<&str>)> = vec![
            (
                "etcd-client.ns1.svc.cluster.local.",
                RecordType::A,
                ResponseCode::NoError,
                vec!["10.0.0.20"],
            ),
            (
                "ETCD-Client.ns1.svc.cluster.local",
                RecordType::A,
                ResponseCode::NoError,
                vec!["10.0.0.20"],
            ),
            (
                "etcd.ns1.svc.cluster.local.",
                RecordType::A,
                ResponseCode::NoError,
                vec!["198.19.1.5"],
            ),
            (
                "etcd-0.etcd.ns1.svc.cluster.local.",
                RecordType::A,
                ResponseCode::NoError,
                vec!["198.19.1.5"],
            ),
            (
                "etcd-client.ns1.svc.cluster.local.",
                RecordType::AAAA,
                ResponseCode::NoError,
                vec![],
            ),
            (
                "nothing.ns1.svc.cluster.local.",
                RecordType::A,
                ResponseCode::NXDomain,
                vec![],
            ),
            (
                "etcd-client.ns1.svc.default.svc.cluster.local.",
                RecordType::A,
                ResponseCode::NXDomain,
                vec![],
            ),
            ("example.com.", RecordType::A, ResponseCode::Refused, vec![]),
        ];
        for (name, t, code, want) in cases {
            let m = ask(name, t);
            assert_eq!(m.metadata.response_code, code, "{name} {t}");
            assert_eq!(addresses(&m), want, "{name} {t}");
            assert_eq!(m.queries.len(), 1, "{name}: the question is echoed");
        }
    }

    #[test]
    fn malformed_queries_never_panic() {
        let r = records();
        assert!(answer(&r, &[]).is_none());
        assert!(answer(&r, &[1]).is_none());
        for len in 2..40 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            let _ = answer(&r, &junk);
        }
        let reply = answer(&r, &[0x12, 0x34, 0xff]).expect("FORMERR");
        let m = Message::from_vec(&reply).unwrap();
        assert_eq!(
            (m.metadata.id, m.metadata.response_code),
            (0x1234, ResponseCode::FormErr)
        );
    }

    #[tokio::test]
    async fn serves_over_udp() {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let stop = CancellationToken::new();
        let task = serve_udp(socket, Arc::new(RwLock::new(records())), stop.clone())
            .await
            .unwrap();
        let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut q = Message::query();
        q.metadata.id = 7;
        q.add_query(Query::query(
            name("etcd-0.etcd.ns1.svc.cluster.local.").unwrap(),
            RecordType::A,
        ));
        client.send_to(&q.to_vec().unwrap(), addr).await.unwrap();
        let mut buf = [0u8; 512];
        let (n, _) = tokio::time::timeout(Duration::from_secs(5), client.recv_from(&mut buf))
            .await
            .expect("an answer within 5 s")
            .unwrap();
        let m = Message::from_vec(&buf[..n]).unwrap();
        assert_eq!(addresses(&m), ["198.19.1.5"]);
        stop.cancel();
        task.await.unwrap();
    }
}
