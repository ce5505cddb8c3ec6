//! What runs of a shoot's control plane on a Kubernetes seed, and whether its
//! API answers: workload status, and `/readyz` asked through the API Service
//! where this ringd can reach it.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};

use super::render::{APISERVER, PKI_SECRET, SHOOT_LABEL};
use super::{component_of, KubernetesSeed};
use crate::error::{Result, SeedError};
use crate::pki::{create_private_dir, Pki};
use crate::process::{Component, ComponentState};
use crate::{kubeconfig, ComponentStatus, ControlPlaneStatus, Health, Phase};

/// How long /readyz is waited for while no kube-apiserver pod is Ready.
const UNREADY_READYZ_TIMEOUT: Duration = Duration::from_secs(1);

/// What the kube-apiserver pods of a shoot say (see `api_pods`).
struct ApiPods {
    running: bool,
    ready: bool,
}

impl KubernetesSeed {
    /// What runs of `shoot`'s control plane and whether its API answers
    /// ([`Seed::inspect`]).
    pub(super) async fn status(&self, shoot: &str) -> Result<ControlPlaneStatus> {
        let spec = self.recorded_spec(shoot).await?;
        let pods = self.pods(shoot, &format!("{SHOOT_LABEL}={shoot}")).await?;
        let mut components = Vec::new();
        let mut desired_total = 0;
        for c in Component::ALL {
            let (desired, ready) = self.replicas(shoot, c).await?.unwrap_or((0, 0));
            desired_total += desired;
            let mut state = ComponentState::default();
            for pod in pods.iter().filter(|p| component_of(p) == Some(c.name())) {
                let statuses = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.clone())
                    .unwrap_or_default();
                for cs in statuses {
                    state.restarts += u32::try_from(cs.restart_count).unwrap_or(0);
                    if let Some(t) = cs.last_state.and_then(|s| s.terminated) {
                        state.last_exit = Some(format!(
                            "exit code {}{}",
                            t.exit_code,
                            t.reason.map(|r| format!(" ({r})")).unwrap_or_default()
                        ));
                    }
                }
            }
            components.push(ComponentStatus {
                component: c,
                running: ready > 0,
                state,
            });
        }
        let health = self.api_health(shoot).await?;
        let all_running = components.iter().all(|c| c.running);
        let phase = match (desired_total, health.ready, all_running) {
            (0, _, _) => Phase::Stopped,
            (_, false, _) => Phase::Starting,
            (_, true, true) => Phase::Ready,
            (_, true, false) => Phase::Degraded,
        };
        let svc = self.api_service(shoot).await?;
        let reachable = self.reachable_url(shoot, svc.as_ref());
        let (api_url, kubeconfig) = match (&self.forwarders, reachable) {
            (Some(_), _) => (
                spec.endpoint.api_url(),
                self.shoot_layout(shoot).admin_kubeconfig(),
            ),
            (None, Ok(url)) => (url, self.admin_kubeconfig(shoot)),
            (None, Err(_)) => (
                format!(
                    "https://{APISERVER}.{}.svc:{}",
                    self.namespace(shoot),
                    spec.endpoint.api_port
                ),
                self.admin_kubeconfig(shoot),
            ),
        };
        Ok(ControlPlaneStatus {
            shoot: shoot.to_string(),
            phase,
            api_url,
            kubeconfig,
            supervisor_pid: None,
            readyz: health.detail,
            components,
        })
    }

    /// Whether `shoot`'s API answers /readyz, asked through its Service
    /// ([`Seed::health`]).
    pub(super) async fn api_health(&self, shoot: &str) -> Result<Health> {
        let anchor = self.anchor(shoot).await?;
        let (desired, ready) = self
            .replicas(shoot, Component::KubeApiserver)
            .await?
            .unwrap_or((0, 0));
        let replicas = format!("kube-apiserver {ready}/{desired} replicas ready");
        let svc = self.api_service(shoot).await?;
        let url = match self.reachable_url(shoot, svc.as_ref()) {
            Ok(url) => url,
            Err(why) => {
                return Ok(Health {
                    ready: false,
                    detail: format!("{replicas}; /readyz not reachable: {why}"),
                    ..Default::default()
                })
            }
        };
        let Some(data) = self.read_pki_secret(shoot).await? else {
            return Ok(Health {
                ready: false,
                detail: format!("{replicas}; Secret {PKI_SECRET} is missing, so there is no admin certificate to ask /readyz with"),
                ..Default::default()
            });
        };
        // The Service (node port or cluster address) routes to the
        // kube-apiserver pods, ready or not (`publishNotReadyAddresses`).
        // With none running, asking /readyz through it could only fail (each
        // ask writes a kubeconfig and may wait 5 s for an answer). One that
        // runs is asked before its readiness probe passed and the host's
        // controllers counted it (every move onto this seed waited 1-2 s
        // longer for that), but briefly: kube-apiserver opens its port
        // seconds before it serves, and a request meanwhile hangs. A load
        // balancer's address may lead elsewhere, so it is asked.
        let internal = svc.as_ref().is_some_and(|s| lb_addresses(s).is_empty());
        // looked at only while the Deployment counts no ready replica
        let pods = if ready == 0 && internal {
            self.api_pods(shoot).await?
        } else {
            ApiPods {
                running: true,
                ready: true,
            }
        };
        let unready = !pods.ready;
        if unready && !pods.running {
            return Ok(Health {
                ready: false,
                detail: format!(
                    "{replicas}; /readyz at {url} not asked: no kube-apiserver container runs"
                ),
                ..Default::default()
            });
        }
        // An admin kubeconfig for the reachable address, from the Secret's PKI
        // (in a temp dir of this check's own: checks run concurrently).
        let shoot_dir = self.shoot_layout(shoot).dir;
        create_private_dir(&shoot_dir)?;
        let temp = tempfile::Builder::new()
            .prefix(".admin-pki")
            .tempdir_in(&shoot_dir)
            .map_err(SeedError::io(&shoot_dir))?;
        let dir = temp.path().to_path_buf();
        for (name, bytes) in data
            .iter()
            .filter(|(n, _)| ["ca.crt", "admin.crt", "admin.key"].contains(&n.as_str()))
        {
            crate::pki::write_scratch(&dir.join(name), bytes)?;
        }
        let pki = Pki::new(&dir);
        let path = self.admin_kubeconfig(shoot);
        kubeconfig::write(
            &path,
            shoot,
            "admin",
            &url,
            &pki,
            &pki.leaf(crate::pki::Leaf::Admin),
        )?;
        let timeout = if unready {
            UNREADY_READYZ_TIMEOUT
        } else {
            kubeconfig::READYZ_TIMEOUT
        };
        let health = kubeconfig::readyz_within(shoot, &path, None, timeout).await;
        let stable = match &health {
            Ok(h) if h.ready => self.stable_health(shoot, &anchor, &url, &pki).await,
            _ => Ok(None),
        };
        drop(temp);
        let health = health?;
        Ok(match stable? {
            _ if !health.ready => Health {
                ready: false,
                detail: format!("{replicas}; /readyz at {url}: {}", health.detail),
                ..Default::default()
            },
            Some(stable) => Health {
                ready: stable.ready,
                detail: format!("{}; {}", health.detail, stable.detail),
                versions: health.versions,
            },
            None => health,
        }
        .with_etcd(crate::images::ETCD.tag.trim_start_matches('v')))
    }

    /// Whether a kube-apiserver pod's container runs (its lease guard, and
    /// kube-apiserver under it once the lease is valid) and whether one is
    /// Ready, as its kubelet reported (before the host's controllers count it).
    async fn api_pods(&self, shoot: &str) -> Result<ApiPods> {
        let pods = self
            .pods(shoot, &super::component_selector(shoot, APISERVER))
            .await?;
        let live = || {
            pods.iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
        };
        let status = |p: &Pod| p.status.clone().unwrap_or_default();
        Ok(ApiPods {
            running: live().any(|p| {
                status(p)
                    .container_statuses
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            }),
            ready: live().any(|p| {
                status(p)
                    .conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            }),
        })
    }

    /// Where this ringd can reach the shoot's API, or why it cannot.
    pub(super) fn reachable_url(
        &self,
        shoot: &str,
        svc: Option<&Service>,
    ) -> std::result::Result<String, String> {
        let Some(svc) = svc else {
            return Err(format!("Service {APISERVER} does not exist"));
        };
        let port = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p.first())
            .map(|p| p.port)
            .unwrap_or(6443);
        if let Some(a) = lb_addresses(svc).first() {
            return Ok(match a {
                LbAddress::Ip(ip) => format!("https://{ip}:{port}"),
                LbAddress::Host(h) => format!("https://{h}:{port}"),
            });
        }
        if self.in_cluster {
            return Ok(format!(
                "https://{APISERVER}.{}.svc:{port}",
                self.namespace(shoot)
            ));
        }
        let ty = svc
            .spec
            .as_ref()
            .and_then(|s| s.type_.clone())
            .unwrap_or_else(|| "ClusterIP".into());
        let node_port = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p.first())
            .and_then(|p| p.node_port);
        if let (Some(ip), Some(node_port), "NodePort") =
            (self.config.node_address, node_port, ty.as_str())
        {
            let port = u16::try_from(node_port).unwrap_or_default();
            return Ok(format!("https://{}", std::net::SocketAddr::new(ip, port)));
        }
        Err(match ty.as_str() {
            "NodePort" if self.config.node_address.is_none() => "Service kube-apiserver is a NodePort, and this ringd runs outside the seed cluster: set seed.kubernetes.nodeAddress to a node address it reaches".to_string(),
            "LoadBalancer" => format!("Service {APISERVER} (LoadBalancer) has no load balancer address yet, and this ringd runs outside the seed cluster"),
            other => format!("Service {APISERVER} is of type {other}, which this ringd (outside the seed cluster) cannot reach"),
        })
    }
}

/// An address of a LoadBalancer Service.
#[derive(Debug, Clone)]
pub(super) enum LbAddress {
    Ip(IpAddr),
    Host(String),
}

pub(super) fn lb_addresses(svc: &Service) -> Vec<LbAddress> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| match (&i.ip, &i.hostname) {
            (Some(ip), _) => ip.parse().ok().map(LbAddress::Ip),
            (None, Some(h)) => Some(LbAddress::Host(h.clone())),
            _ => None,
        })
        .collect()
}
