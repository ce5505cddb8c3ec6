//! The benchmarks' write load: a writer creating ConfigMaps at a steady
//! rate that records when each create was acknowledged, and the count of
//! acknowledged writes a control plane lacks afterwards (what a failover lost).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, PostParams};

use bootstrap::BootstrapError;

/// Creates ConfigMaps labelled `load=<run>` at `rate` per second (at most 32 in
/// flight) until stopped; records when each acknowledged create was acknowledged.
pub(super) struct Load {
    acked: Arc<Mutex<Vec<(String, Instant)>>>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    pub(super) fn start(api: kube::Api<ConfigMap>, run: usize, rate: u64) -> Load {
        let acked: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let (a, st) = (acked.clone(), stop.clone());
        let task = tokio::spawn(async move {
            if rate == 0 {
                return;
            }
            let slots = Arc::new(tokio::sync::Semaphore::new(32));
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            for i in 0u64.. {
                tokio::select! {
                    biased;
                    _ = st.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    continue; // the API is down or slow: this tick's write is not attempted
                };
                let (api, a) = (api.clone(), a.clone());
                tokio::spawn(async move {
                    let name = format!("load-{run}-{i}");
                    let cm = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            labels: Some([("load".to_string(), run.to_string())].into()),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    let res = tokio::time::timeout(
                        Duration::from_secs(2),
                        api.create(&PostParams::default(), &cm),
                    )
                    .await;
                    if matches!(res, Ok(Ok(_))) {
                        if let Ok(mut v) = a.lock() {
                            v.push((name, Instant::now()));
                        }
                    }
                    drop(permit);
                });
            }
        });
        Load { acked, stop, task }
    }

    /// Stops writing; the acknowledged writes.
    pub(super) async fn stop(self) -> Vec<(String, Instant)> {
        self.stop.cancel();
        let _ = self.task.await;
        // let writes in flight finish (each is bounded to 2 s)
        tokio::time::sleep(Duration::from_millis(2100)).await;
        self.acked.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

/// The load's writes acknowledged before the kill, and those of them the
/// restored control plane lacks.
pub(super) struct Writes {
    pub(super) acked: usize,
    pub(super) lost: usize,
    pub(super) lost_after_kill: usize,
    /// How far before the kill the oldest lost write was acknowledged (0 if none).
    pub(super) rpo_secs: f64,
}

pub(super) async fn lost_writes(
    api: &kube::Api<ConfigMap>,
    run: usize,
    acked: &[(String, Instant)],
    killed: Instant,
) -> Result<Writes, BootstrapError> {
    let before: Vec<&(String, Instant)> = acked.iter().filter(|(_, at)| *at <= killed).collect();
    let present: std::collections::BTreeSet<String> = api
        .list(&ListParams::default().labels(&format!("load={run}")))
        .await
        .map_err(|e| BootstrapError::Ring(ringd::RingError::Transport(e.to_string())))?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    let lost: Vec<&&(String, Instant)> = before
        .iter()
        .filter(|(n, _)| !present.contains(n))
        .collect();
    let rpo_secs = lost
        .iter()
        .map(|(_, at)| killed.saturating_duration_since(*at).as_secs_f64())
        .fold(0.0, f64::max);
    let lost_after_kill = acked
        .iter()
        .filter(|(n, at)| *at > killed && !present.contains(n))
        .count();
    Ok(Writes {
        acked: before.len(),
        lost: lost.len(),
        lost_after_kill,
        rpo_secs,
    })
}
