//! What a node reports about itself (`status.json` in its state dir): its
//! processes, whether it registered with its shoot, and if not, why.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use k8s_openapi::api::core::v1::NodeCondition;

use super::NodeConfig;
use crate::process::{Component, States};

/// The node as its shoot's kube-apiserver sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Registration {
    /// The Node object exists.
    pub registered: bool,
    /// Its Ready condition is True, posted by the kubelet of this run.
    pub ready: bool,
    /// The kubelet's version, as the Node object reports it (`v1.37.2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
    /// The container runtime's, likewise (`containerd://v2.4.2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_runtime_version: Option<String>,
}

/// The content of a node's `status.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub node: String,
    /// The `ring-node` supervisor.
    pub pid: u32,
    /// Starting, ImportingImages, Running, Stopping, Stopped.
    pub phase: String,
    #[serde(flatten)]
    pub registration: Registration,
    /// Why the node is not Ready, when it is not (certificate, endpoint, runtime).
    pub problem: Option<String>,
    /// The machine's cgroup hierarchy (`v1`, `v2`) and, on v1, that kubelet
    /// runs on it only with `failCgroupV1: false` (Kubernetes deprecated v1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroups: Option<String>,
    pub components: States,
    /// The serial of the kube-proxy certificate kube-proxy and the cluster
    /// DNS use (see `ringctl pki renew`).
    #[serde(default)]
    pub proxy_certificate_serial: Option<String>,
    /// Unix seconds of the last update.
    pub updated: u64,
}

/// Keeps `status.json` current.
#[derive(Clone)]
pub struct Reporter {
    config: NodeConfig,
    status: Arc<Mutex<NodeStatus>>,
    /// Set when the node cannot work at all (missing images, dead runtime): it
    /// wins over whatever the shoot says.
    fatal: Arc<Mutex<Option<String>>>,
    states: watch::Receiver<States>,
    /// Unix seconds when this `ring-node` started: a Ready condition with an
    /// older heartbeat is the previous kubelet's.
    started: i64,
}

impl Reporter {
    pub fn new(config: NodeConfig, states: watch::Receiver<States>) -> Reporter {
        let status = NodeStatus {
            node: config.name.clone(),
            pid: std::process::id(),
            phase: "Starting".into(),
            cgroups: Some(cgroups_note(super::cgroup_v2())),
            ..Default::default()
        };
        let r = Reporter {
            config,
            status: Arc::new(Mutex::new(status)),
            fatal: Arc::new(Mutex::new(None)),
            states,
            started: crate::process::unix_now() as i64,
        };
        r.write();
        r
    }

    fn update(&self, f: impl FnOnce(&mut NodeStatus)) {
        {
            let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut s);
            s.components = self.states.borrow().clone();
            s.updated = crate::process::unix_now();
        }
        self.write();
    }

    fn write(&self) {
        let s = self
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let path = self.config.layout().status_file();
        if let Ok(text) = serde_json::to_vec_pretty(&s) {
            if let Err(e) = crate::pki::write_private(&path, &text) {
                tracing::warn!(error = %e, "cannot write the node's status");
            }
        }
    }

    /// Sets the phase.
    pub fn phase(&self, phase: &str) {
        self.update(|s| s.phase = phase.into());
    }

    /// Records the serial of the kube-proxy certificate in use.
    pub fn proxy_serial(&self, serial: Option<String>) {
        self.update(|s| s.proxy_certificate_serial = serial);
    }

    /// Records why the node cannot work at all (shown until the node stops).
    pub fn fatal(&self, problem: String) {
        *self.fatal.lock().unwrap_or_else(|p| p.into_inner()) = Some(problem.clone());
        self.update(|s| s.problem = Some(problem));
    }

    /// Every 2 s until `stop`: asks the shoot about the node and explains what
    /// keeps it from being Ready.
    pub async fn watch(self, stop: CancellationToken) {
        let kubeconfig = self.config.layout().config_file("kubelet.kubeconfig");
        loop {
            let seen = registration(&self.config, &kubeconfig, self.started).await;
            let fatal = self.fatal.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let problem = match &seen {
                _ if fatal.is_some() => fatal,
                Ok(r) if r.ready => None,
                Ok(r) => Some(self.diagnose(r)),
                Err(e) => Some(e.clone()),
            };
            self.update(|s| {
                if s.phase == "Running" || s.phase == "ImportingImages" || s.phase == "Starting" {
                    s.registration = seen.clone().unwrap_or_default();
                    s.problem = problem;
                }
            });
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    }

    fn diagnose(&self, r: &Registration) -> String {
        let states = self.states.borrow().clone();
        for c in [Component::Containerd, Component::Kubelet] {
            let s = states.get(&c).cloned().unwrap_or_default();
            if s.pid.is_none() {
                return format!(
                    "runtime: {c} is not running (last exit: {}); see {}",
                    s.last_exit.as_deref().unwrap_or("none yet"),
                    self.config.layout().log(c).display()
                );
            }
        }
        let log = self.config.layout().log(Component::Kubelet);
        let last_error = crate::ShootLayout::tail(&log, 200)
            .lines()
            .rev()
            .find(|l| l.starts_with('E'))
            .map(|l| l.chars().take(300).collect::<String>());
        let what = if r.registered {
            "registered but not Ready"
        } else {
            "not registered yet"
        };
        match last_error {
            Some(e) => format!("{what}; kubelet's last error: {e}"),
            None => format!("{what}; see {}", log.display()),
        }
    }
}

/// What a node's status says of the machine's cgroups.
pub fn cgroups_note(v2: bool) -> String {
    match v2 {
        true => "v2".into(),
        false => "v1: kubelet runs with failCgroupV1: false (Kubernetes deprecated cgroup v1 and refuses it by default)".into(),
    }
}

/// Whether `conditions` say Ready with a heartbeat at or after `since` (unix
/// seconds). Right after a restart the shoot still holds the Ready condition
/// the previous kubelet posted (the node controller marks it Unknown only
/// after its grace period, 40 s): taken for this run's, a returning machine's
/// node counted Ready before its kubelet had even registered again.
pub fn ready_since(conditions: &[NodeCondition], since: i64) -> bool {
    conditions.iter().any(|c| {
        c.type_ == "Ready"
            && c.status == "True"
            && c.last_heartbeat_time
                .as_ref()
                .is_some_and(|t| t.0.as_second() >= since)
    })
}

/// How long one question about the node may take. The shoot's endpoint can
/// accept a connection and not answer (a relay whose control plane is moving):
/// kube's client would wait 30 s for the TLS handshake, and the node's status,
/// which bootstrap waits on, stayed "not Ready" that long after the API was back.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(3);

/// What the shoot says about this node, asked with the node's own credentials
/// (Ready only as posted since `since`, see [`ready_since`]), within
/// [`REGISTRATION_TIMEOUT`]. Errors name the cause: endpoint unreachable or
/// silent, certificate refused.
async fn registration(
    config: &NodeConfig,
    kubeconfig: &std::path::Path,
    since: i64,
) -> Result<Registration, String> {
    tokio::time::timeout(REGISTRATION_TIMEOUT, ask_registration(config, kubeconfig, since))
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "endpoint: the shoot's kube-apiserver at {} did not answer within {} s; is its control plane moving (`ringctl status`)?",
                config.api_server,
                REGISTRATION_TIMEOUT.as_secs()
            ))
        })
}

async fn ask_registration(
    config: &NodeConfig,
    kubeconfig: &std::path::Path,
    since: i64,
) -> Result<Registration, String> {
    use k8s_openapi::api::core::v1::Node;
    if let Err(e) = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(config.api_server),
    )
    .await
    .map_err(|_| "timed out".to_string())
    .and_then(|r| r.map_err(|e| e.to_string()))
    {
        return Err(format!(
            "endpoint: the shoot's kube-apiserver at {} is not reachable ({e}); is its control plane up (`ringctl status`)?",
            config.api_server
        ));
    }
    let client = crate::kubeconfig::client(&config.name, kubeconfig)
        .await
        .map_err(|e| format!("certificate: {e}"))?;
    let api: kube::Api<Node> = kube::Api::all(client);
    match api.get_opt(&config.name).await {
        Ok(None) => Ok(Registration::default()),
        Ok(Some(node)) => {
            let status = node.status.unwrap_or_default();
            let ready = ready_since(status.conditions.as_deref().unwrap_or_default(), since);
            let info = status.node_info;
            Ok(Registration {
                registered: true,
                ready,
                kubelet_version: info.as_ref().map(|i| i.kubelet_version.clone()),
                container_runtime_version: info.map(|i| i.container_runtime_version),
            })
        }
        Err(kube::Error::Api(e)) if e.code == 401 => Err(format!(
            "certificate: the shoot's kube-apiserver refuses the node's certificate {} (401: not issued by the shoot's CA?); rerun `ringctl bootstrap` to issue it again",
            config.layout().node_cert().cert.display()
        )),
        Err(kube::Error::Api(e)) if e.code == 403 => Err(format!(
            "authorization: the shoot's kube-apiserver forbids node {} to read itself ({}); it needs --authorization-mode=Node,RBAC",
            config.name, e.message
        )),
        Err(e) => Err(format!("endpoint: asking the shoot about node {}: {e}", config.name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn condition(type_: &str, status: &str, heartbeat: Option<i64>) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            last_heartbeat_time: heartbeat
                .map(|s| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())),
            ..Default::default()
        }
    }

    /// Ready counts only with a heartbeat from this run: one posted before
    /// the ring-node started is the previous kubelet's.
    #[test]
    fn only_a_ready_condition_posted_since_the_start_counts() {
        let since = 1_800_000_000;
        for (conditions, ready) in [
            (vec![condition("Ready", "True", Some(since))], true),
            (vec![condition("Ready", "True", Some(since + 3))], true),
            (vec![condition("Ready", "True", Some(since - 26))], false),
            (vec![condition("Ready", "True", None)], false),
            (vec![condition("Ready", "False", Some(since + 3))], false),
            (
                vec![condition("MemoryPressure", "True", Some(since + 3))],
                false,
            ),
            (vec![], false),
        ] {
            assert_eq!(ready_since(&conditions, since), ready, "{conditions:?}");
        }
    }

    /// An endpoint that accepts and never answers (a relay whose control
    /// plane is moving) gets an answer within the bound, naming the cause;
    /// before, kube's 30 s connect timeout held the node's status that long.
    #[tokio::test]
    async fn a_silent_endpoint_is_reported_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let mut config = crate::node::render::tests::config();
        config.state_dir = dir.path().into();
        config.api_server = addr;
        let (ca_cert, ca_key) = crate::pki::new_ca("shoot m1").unwrap();
        config.issue_credentials(&ca_cert, &ca_key).unwrap();
        let layout = config.layout();
        let kubeconfig = dir.path().join("kubelet.kubeconfig");
        crate::kubeconfig::write(
            &kubeconfig,
            "m1",
            "system:node:m1",
            &format!("https://{addr}"),
            &layout.pki(),
            &layout.node_cert(),
        )
        .unwrap();
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            registration(&config, &kubeconfig, 0),
        )
        .await
        .expect("the question about the node hung past 20 s");
        let err = answer.unwrap_err();
        assert!(
            err.contains("did not answer within 3 s") && err.contains(&addr.to_string()),
            "{err}"
        );
        held.abort();
    }
}
