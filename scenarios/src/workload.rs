//! The drill's workload: writers creating ConfigMaps and Secrets and updating a
//! counter ConfigMap through each shoot's kube-apiserver at a given rate,
//! recording every acknowledged write with its resourceVersion; probes of each
//! shoot's API; and the final read-back of what each shoot holds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::Api;
use tokio_util::sync::CancellationToken;

use crate::drill::{ObjectKind, Workload};
use crate::result::{Ack, Present};
use crate::rng::Rng;

/// The label every object a drill writes carries.
pub const LABEL: &str = "ring.gardener.cloud/drill-writer";
const NAMESPACE: &str = "default";
/// Bound on one request of a writer or a probe.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the writers of one shoot recorded.
#[derive(Debug, Default, Clone)]
pub struct ShootLog {
    pub acks: Vec<Ack>,
    pub failures: u64,
}

/// The running writers.
pub struct Writers {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    logs: Arc<Mutex<BTreeMap<String, ShootLog>>>,
}

/// A kube client for a shoot's kubeconfig, retried until `stop` (the API may be down).
async fn client(
    shoot: &str,
    kubeconfig: &std::path::Path,
    stop: &CancellationToken,
) -> Option<kube::Client> {
    loop {
        match seed::kubeconfig::client(shoot, kubeconfig).await {
            Ok(c) => return Some(c),
            Err(e) => tracing::debug!(%shoot, error = %e, "no client yet"),
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

fn meta(name: &str, writer: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some([(LABEL.to_string(), writer.to_string())].into()),
        ..Default::default()
    }
}

fn rv(meta: &ObjectMeta) -> i64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One write; `Ok((kind, name, generation, resourceVersion))` once acknowledged.
async fn write_once(
    client: &kube::Client,
    writer: &str,
    seq: u64,
    kind: ObjectKind,
    update: bool,
) -> Result<(ObjectKind, String, Option<u64>, i64), kube::Error> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    if update {
        let name = format!("drill-counter-{writer}");
        let patch = serde_json::json!({"data": {"gen": seq.to_string()}});
        let res = cms
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        let cm = match res {
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let cm = ConfigMap {
                    metadata: meta(&name, writer),
                    data: Some([("gen".to_string(), seq.to_string())].into()),
                    ..Default::default()
                };
                cms.create(&PostParams::default(), &cm).await?
            }
            other => other?,
        };
        return Ok((ObjectKind::ConfigMap, name, Some(seq), rv(&cm.metadata)));
    }
    let name = format!("drill-{writer}-{seq}");
    let data = [("seq".to_string(), seq.to_string())].into();
    let meta_rv = match kind {
        ObjectKind::ConfigMap => {
            let cm = ConfigMap {
                metadata: meta(&name, writer),
                data: Some(data),
                ..Default::default()
            };
            rv(&cms.create(&PostParams::default(), &cm).await?.metadata)
        }
        ObjectKind::Secret => {
            let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
            let s = Secret {
                metadata: meta(&name, writer),
                string_data: Some(data),
                ..Default::default()
            };
            rv(&secrets.create(&PostParams::default(), &s).await?.metadata)
        }
    };
    Ok((kind, name, None, meta_rv))
}

impl Writers {
    /// Starts `workload.writersPerShoot` writers per shoot; times are measured from `t0`.
    pub fn start(
        shoots: &[(String, PathBuf)],
        workload: &Workload,
        rng: &Rng,
        t0: Instant,
    ) -> Writers {
        let stop = CancellationToken::new();
        let logs: Arc<Mutex<BTreeMap<String, ShootLog>>> = Arc::default();
        let mut tasks = Vec::new();
        for (si, (shoot, kubeconfig)) in shoots.iter().enumerate() {
            lock(&logs).insert(shoot.clone(), ShootLog::default());
            for w in 0..workload.writers_per_shoot {
                let mut rng = rng.fork((si as u64) << 8 | u64::from(w));
                let (stop, logs, shoot, kubeconfig) = (
                    stop.clone(),
                    logs.clone(),
                    shoot.clone(),
                    kubeconfig.clone(),
                );
                let workload = workload.clone();
                tasks.push(tokio::spawn(async move {
                    let Some(client) = client(&shoot, &kubeconfig, &stop).await else {
                        return;
                    };
                    let writer = format!("w{w}");
                    let period = 1.0 / workload.rate_per_second;
                    let mut seq = 0u64;
                    loop {
                        seq += 1;
                        let kind = workload.kinds[rng.below(workload.kinds.len())];
                        let update = seq.is_multiple_of(u64::from(workload.update_every));
                        let res = tokio::time::timeout(
                            REQUEST_TIMEOUT,
                            write_once(&client, &writer, seq, kind, update),
                        )
                        .await;
                        let at_ms = t0.elapsed().as_millis() as u64;
                        {
                            let mut logs = lock(&logs);
                            let log = logs.entry(shoot.clone()).or_default();
                            match res {
                                Ok(Ok((kind, name, generation, resource_version))) => {
                                    log.acks.push(Ack {
                                        kind,
                                        name,
                                        generation,
                                        resource_version,
                                        at_ms,
                                    })
                                }
                                _ => log.failures += 1,
                            }
                        }
                        // ±20 % jitter, from the drill's RNG
                        let pause = period * (0.8 + 0.4 * rng.unit());
                        tokio::select! {
                            biased;
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_secs_f64(pause)) => {}
                        }
                    }
                }));
            }
        }
        Writers { stop, tasks, logs }
    }

    /// Acknowledged writes per shoot so far.
    pub fn acked(&self) -> BTreeMap<String, usize> {
        lock(&self.logs)
            .iter()
            .map(|(s, l)| (s.clone(), l.acks.len()))
            .collect()
    }

    /// Stops every writer (an in-flight write is awaited, bounded by its timeout)
    /// and returns what they recorded.
    pub async fn stop(self) -> BTreeMap<String, ShootLog> {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        let logs = lock(&self.logs).clone();
        logs
    }
}

/// Shoot → availability samples `(seconds since t0, answered)`.
type Samples = Arc<Mutex<BTreeMap<String, Vec<(f64, bool)>>>>;

/// Probes every shoot's API (a one-item list, bounded) every `period`; samples
/// are `(seconds since t0, answered)`.
pub struct Probes {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    samples: Samples,
}

impl Probes {
    /// Starts one prober per shoot.
    pub fn start(shoots: &[(String, PathBuf)], period: Duration, t0: Instant) -> Probes {
        let stop = CancellationToken::new();
        let samples: Samples = Arc::default();
        let mut tasks = Vec::new();
        for (shoot, kubeconfig) in shoots {
            lock(&samples).insert(shoot.clone(), Vec::new());
            let (stop, samples, shoot, kubeconfig) = (
                stop.clone(),
                samples.clone(),
                shoot.clone(),
                kubeconfig.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let Some(c) = client(&shoot, &kubeconfig, &stop).await else {
                    return;
                };
                let api: Api<ConfigMap> = Api::namespaced(c, NAMESPACE);
                loop {
                    let ok = matches!(
                        tokio::time::timeout(
                            Duration::from_secs(1),
                            api.list_metadata(&ListParams::default().limit(1))
                        )
                        .await,
                        Ok(Ok(_))
                    );
                    let t = t0.elapsed().as_secs_f64();
                    lock(&samples)
                        .entry(shoot.clone())
                        .or_default()
                        .push((t, ok));
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(period) => {}
                    }
                }
            }));
        }
        Probes {
            stop,
            tasks,
            samples,
        }
    }

    /// Whether the newest sample of `shoot` answered.
    pub fn up(&self, shoot: &str) -> bool {
        lock(&self.samples)
            .get(shoot)
            .and_then(|s| s.last())
            .is_some_and(|(_, ok)| *ok)
    }

    /// Stops probing; returns the samples.
    pub async fn stop(self) -> BTreeMap<String, Vec<(f64, bool)>> {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        let s = lock(&self.samples).clone();
        s
    }
}

/// What a shoot holds: every object the drill's writers made, with the counters' values.
pub async fn read_back(shoot: &str, kubeconfig: &std::path::Path) -> Result<Present, String> {
    let c = seed::kubeconfig::client(shoot, kubeconfig)
        .await
        .map_err(|e| e.to_string())?;
    let lp = ListParams::default().labels(LABEL);
    let mut present = Present::new();
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), NAMESPACE);
    let list = tokio::time::timeout(Duration::from_secs(30), cms.list(&lp))
        .await
        .map_err(|_| format!("listing ConfigMaps of {shoot} took over 30s"))?
        .map_err(|e| format!("listing ConfigMaps of {shoot}: {e}"))?;
    for cm in list.items {
        let generation = cm
            .data
            .as_ref()
            .and_then(|d| d.get("gen"))
            .and_then(|g| g.parse().ok())
            .unwrap_or(0);
        if let Some(name) = cm.metadata.name {
            present.insert((ObjectKind::ConfigMap, name), generation);
        }
    }
    let secrets: Api<Secret> = Api::namespaced(c, NAMESPACE);
    let list = tokio::time::timeout(Duration::from_secs(30), secrets.list_metadata(&lp))
        .await
        .map_err(|_| format!("listing Secrets of {shoot} took over 30s"))?
        .map_err(|e| format!("listing Secrets of {shoot}: {e}"))?;
    for s in list.items {
        if let Some(name) = s.metadata.name {
            present.insert((ObjectKind::Secret, name), 0);
        }
    }
    Ok(present)
}
