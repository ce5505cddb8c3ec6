//! Disaster recovery: `ringctl restore --from-bucket URL [--config ring.yaml]`
//! rebuilds a lost local ring from its backup bucket alone.
//!
//! It follows the bootstrap plan (config, a new ring CA and identities, member
//! configs, ringd per member, quorum, control planes, kubeconfigs) with one more
//! kind of step before any ringd starts: each shoot's identity (spec with its
//! endpoint, PKI) and etcd data are restored from the bucket onto the member
//! that hosts it in a fresh ring (its predecessor, or its first host in a
//! self-hosted ring), up to the newest durable
//! delta. When the ringds come up they find the restored shoots and serve them
//! on their unchanged endpoints, so kubeconfigs from the lost ring keep working.
//! The plan is pure over what is on disk (a restored shoot has a marker with its
//! restore report), so a rerun after a crash resumes. With `selfHosting` the
//! plan goes on like a bootstrap: the nodes come up and every control plane
//! moves from its temporary processes into pods on its predecessor's node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ringd::RingError;
use serde::{Deserialize, Serialize};

use crate::config::RingConfig;
use crate::plan::{self, Observed, Step};
use crate::{BootstrapError, Progress, RingLayout};

pub mod stale;

/// The dir (in the ring's state dir) holding one marker per restored shoot,
/// `<shoot>.json` with its restore report. It lives outside the seeds: a
/// self-hosted ring's pivot moves the restored data off its first host.
pub const MARKERS: &str = "restored-from-bucket";

/// One step of rebuilding a ring from its bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreStep {
    /// A step of the ordinary bootstrap plan.
    Bootstrap(Step),
    /// Restore `shoot` from the bucket into `host`'s seed (before any ringd starts).
    RestoreShoot { shoot: String, host: String },
    /// Remove from restored `shoot`'s API the lost ring's control-plane pods
    /// and workloads (namespaces `shoot--<ring>--*`): nothing of them runs any
    /// more, and the shoot's nodes, once started, would run them again. Done
    /// before any node starts; the pivot creates them anew.
    ClearStaleWorkloads { shoot: String },
}

impl RestoreStep {
    /// A short label for progress output and timings.
    pub fn label(&self) -> String {
        match self {
            RestoreStep::Bootstrap(s) => s.label(),
            RestoreStep::RestoreShoot { shoot, host } => {
                format!("restore {shoot} from the bucket onto {host}")
            }
            RestoreStep::ClearStaleWorkloads { shoot } => {
                format!("clear the lost ring's pods from {shoot}")
            }
        }
    }
}

/// The member that hosts `shoot` in a fresh ring: where
/// [`crate::plan::initial_hosts`] starts it (a self-hosted ring), else its
/// predecessor in ring order. The ring's first state places it there, so its
/// restored data must be in that member's seed.
pub fn host_of(config: &RingConfig, shoot: &str) -> Option<String> {
    if let Some(host) = crate::plan::initial_hosts(config).remove(shoot) {
        return Some(host);
    }
    let n = config.members.len();
    let i = config.members.iter().position(|m| m.name == shoot)?;
    Some(config.members[(i + n - 1) % n].name.clone())
}

/// What the restore has done to each shoot, as its markers say.
#[derive(Debug, Clone, Default)]
pub struct Marks {
    /// Shoots restored from the bucket.
    pub restored: BTreeSet<String>,
    /// Shoots whose API no longer holds the lost ring's pods.
    pub cleared: BTreeSet<String>,
}

/// The next step: the bootstrap plan, with every shoot restored before the
/// first ringd starts, and the lost ring's pods cleared from every shoot
/// before the first node starts.
pub fn next_step(config: &RingConfig, o: &Observed, done: &Marks) -> RestoreStep {
    let step = plan::next_step(config, o);
    if matches!(
        step,
        Step::WriteConfig | Step::IssuePki | Step::WriteMemberConfigs
    ) {
        return RestoreStep::Bootstrap(step);
    }
    if let Some(m) = config
        .members
        .iter()
        .find(|m| !done.restored.contains(&m.name))
    {
        return RestoreStep::RestoreShoot {
            shoot: m.name.clone(),
            host: host_of(config, &m.name).unwrap_or_default(),
        };
    }
    // images, the node network and node configs start nothing; a node's start
    // waits until every shoot's API is clear of the lost ring's pods (the
    // plan starts nodes while the control planes come up: here they wait)
    let starts_a_node = matches!(step, Step::StartNode(_));
    let Some(m) = config
        .members
        .iter()
        .map(|m| m.name.clone())
        .find(|m| starts_a_node && !done.cleared.contains(m))
    else {
        return RestoreStep::Bootstrap(step);
    };
    let names = || config.members.iter().map(|m| m.name.clone());
    if !o.ready.contains(&m) {
        let waiting = names().filter(|s| !o.ready.contains(s)).collect();
        return RestoreStep::Bootstrap(Step::AwaitControlPlanes(waiting));
    }
    if !o.kubeconfigs.contains(&m) {
        let serving = names()
            .filter(|s| o.ready.contains(s) && !o.kubeconfigs.contains(s))
            .collect();
        return RestoreStep::Bootstrap(Step::PublishKubeconfigs(serving));
    }
    RestoreStep::ClearStaleWorkloads { shoot: m }
}

/// Options of [`restore`].
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// The ring's shape (members, ports, timing); `None`: the one in the state dir.
    pub config: Option<RingConfig>,
    /// The bucket the lost ring backed up to.
    pub bucket_url: String,
    pub dir: PathBuf,
    /// The ringd binary.
    pub ringd: PathBuf,
    /// Bound on the whole run.
    pub timeout: Duration,
    /// The user's copy of the bucket key (`--bucket-key`): installed as the
    /// ring's key file (`<dir>/bucket.key`) and named in its config.
    pub bucket_key: Option<PathBuf>,
}

/// What one shoot's restore reached.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShootRestore {
    pub shoot: String,
    pub host: String,
    pub revision: i64,
    pub full: String,
    pub deltas: usize,
    pub verified: bool,
    pub seconds: f64,
}

/// What `restore` did and where the ring stands.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreReport {
    pub ring: String,
    pub bucket: String,
    pub state_dir: PathBuf,
    pub shoots: Vec<ShootRestore>,
    /// Wall time of each kind of step, in order, in seconds.
    pub steps: Vec<(String, f64)>,
    pub total_secs: f64,
    pub status: ringd::status::RingStatus,
    pub kubeconfigs: Vec<(String, PathBuf)>,
}

fn marker(layout: &RingLayout, shoot: &str) -> PathBuf {
    layout.dir.join(MARKERS).join(format!("{shoot}.json"))
}

fn cleared_marker(layout: &RingLayout, shoot: &str) -> PathBuf {
    layout.dir.join(MARKERS).join(format!("{shoot}.cleared"))
}

fn marks_on_disk(layout: &RingLayout, config: &RingConfig) -> Marks {
    let names = || config.members.iter().map(|m| m.name.clone());
    Marks {
        restored: names()
            .filter(|m| read_marker(layout, m).is_some())
            .collect(),
        cleared: names()
            .filter(|m| cleared_marker(layout, m).exists())
            .collect(),
    }
}

fn read_marker(layout: &RingLayout, shoot: &str) -> Option<ShootRestore> {
    let text = std::fs::read(marker(layout, shoot)).ok()?;
    serde_json::from_slice(&text).ok()
}

async fn restore_shoot(
    layout: &RingLayout,
    bucket: &ringd::backups::RingBucket,
    shoot: &str,
    host: &str,
) -> Result<(), BootstrapError> {
    if let Some(pid) = layout.running_pid(host) {
        return Err(BootstrapError::Unsupported(format!(
            "ringd {host} already runs (pid {pid}) but {shoot} was not restored onto it yet; \
             stop it (`ringctl down`) and run the restore again"
        )));
    }
    let started = Instant::now();
    let search = seed::BinarySearch::standard(None);
    let bins = search.control_plane().map_err(RingError::from)?;
    let etcd = search.find("etcd").map_err(RingError::from)?;
    let etcdutl = search.find("etcdutl").map_err(RingError::from)?;
    let seed = seed::LocalSeed::new(layout.seed_dir(host), bins);
    let cancel = tokio_util::sync::CancellationToken::new();
    let report =
        ringd::executor::restore_from_bucket(bucket, &seed, shoot, &etcd, &etcdutl, &cancel)
            .await?;
    let done = ShootRestore {
        shoot: shoot.to_string(),
        host: host.to_string(),
        revision: report.reached_revision,
        full: report.full.clone(),
        deltas: report.deltas,
        verified: report.verified,
        seconds: started.elapsed().as_secs_f64(),
    };
    let json = serde_json::to_vec_pretty(&done).map_err(|e| RingError::Encode(e.to_string()))?;
    let path = marker(layout, shoot);
    seed::pki::create_private_dir(path.parent().unwrap_or(&layout.dir)).map_err(RingError::from)?;
    seed::pki::write_private(&path, &json).map_err(RingError::from)?;
    Ok(())
}

/// `config` sealing its bucket with the key file `key` (the user's copy),
/// installed in the state dir. The lost ring's config names the key file in
/// the lost state dir, which is gone or holds the same key: the copy takes
/// its place. Refused when the config names a key from the environment or a
/// file holding another key, since one of the two cannot read the bucket.
fn with_given_key(
    mut config: RingConfig,
    layout: &RingLayout,
    key: &Path,
) -> Result<RingConfig, BootstrapError> {
    let conflict = |reason: String| BootstrapError::Config {
        field: "--bucket-key".into(),
        reason,
    };
    let named = config.bucket_encryption.take().unwrap_or_default();
    if let Some(var) = &named.key_env {
        return Err(conflict(format!(
            "the config reads its bucketEncryption key from ${var}: give that or --bucket-key, not both"
        )));
    }
    if let Some(file) = named.key_file.as_deref() {
        if file != layout.bucket_key() && differs(file, key) {
            return Err(conflict(format!(
                "the config's bucketEncryption keyFile {} holds another key than {}: drop bucketEncryption from the config or --bucket-key",
                file.display(),
                key.display()
            )));
        }
    }
    crate::bucket_key::install(layout, key)?;
    config.bucket_encryption = Some(backup::config::EncryptionConfig {
        key_id: named.key_id,
        ..crate::bucket_key::generated_key(layout)
    });
    Ok(config)
}

/// Whether the key file `file` exists and holds another key than `given`
/// (an unreadable `given` is reported when it is installed).
fn differs(file: &Path, given: &Path) -> bool {
    let parse = |p: &Path| {
        let text = std::fs::read(p).ok()?;
        backup::codec::EncryptionKey::parse(&text, "", None)
            .ok()
            .map(|k| k.to_hex())
    };
    match (parse(file), parse(given)) {
        (Some(a), Some(b)) => a != b,
        (None, _) => file.exists(),
        (Some(_), None) => false,
    }
}

/// Rebuilds the ring described by the options from its bucket, or resumes an
/// interrupted restore.
pub async fn restore(
    opts: &RestoreOptions,
    progress: &dyn Progress,
) -> Result<RestoreReport, BootstrapError> {
    crate::config::check_bucket_url(&opts.bucket_url).map_err(|reason| BootstrapError::Config {
        field: "--from-bucket".into(),
        reason,
    })?;
    let layout = RingLayout {
        dir: opts.dir.clone(),
    };
    let stored = layout.read_config()?;
    let mut config = match (&opts.config, &stored) {
        (Some(c), _) => c.clone(),
        (None, Some(c)) => c.clone(),
        (None, None) => {
            return Err(BootstrapError::Config {
                field: "--config".into(),
                reason: format!(
                    "{} holds no ring config: give the lost ring's config (--config ring.yaml: its members, ports and timing); the bucket holds every shoot's identity and data but not the ring's shape",
                    opts.dir.display()
                ),
            })
        }
    };
    config.bucket = Some(opts.bucket_url.clone());
    if let Some(key) = &opts.bucket_key {
        config = with_given_key(config, &layout, key)?;
    }
    config.validate()?;
    let bucket = ringd::backups::RingBucket::new(
        backup::BucketConfig::url(opts.bucket_url.clone()),
        config.bucket_encryption.clone(),
        "--bucket-key (or bucketEncryption in the config)",
    )?;
    if let Some(stored) = &stored {
        if *stored != config {
            return Err(BootstrapError::Conflict {
                dir: opts.dir.clone(),
                existing: stored.name.clone(),
            });
        }
    }
    let started = Instant::now();
    let deadline = started + opts.timeout;
    let mut steps: Vec<(String, f64)> = Vec::new();
    let mut current: Option<(String, Instant)> = None;
    let mut starts: BTreeMap<String, u32> = BTreeMap::new();
    loop {
        let observed = crate::observe::observe(&layout, &config).await;
        let step = next_step(&config, &observed, &marks_on_disk(&layout, &config));
        if let RestoreStep::Bootstrap(Step::StartMember(m)) = &step {
            let n = starts.entry(m.clone()).or_default();
            *n += 1;
            if *n > 2 {
                return Err(BootstrapError::Unsupported(format!(
                    "ringd {m} exits right after starting; {}",
                    crate::executor::stuck_detail(&layout, &config, &Step::StartMember(m.clone()))
                )));
            }
        }
        let label = step.label();
        if current.as_ref().is_none_or(|(l, _)| *l != label) {
            if let Some((l, t)) = current.take() {
                progress.finished(&l, t.elapsed());
                steps.push((l, t.elapsed().as_secs_f64()));
            }
            if step == RestoreStep::Bootstrap(Step::Done) {
                break;
            }
            progress.step(&label);
            current = Some((label.clone(), Instant::now()));
        }
        if Instant::now() >= deadline {
            let inner = match &step {
                RestoreStep::Bootstrap(s) => s.clone(),
                _ => Step::Done,
            };
            return Err(BootstrapError::Timeout {
                step: label,
                waited_secs: opts.timeout.as_secs(),
                detail: crate::executor::stuck_detail(&layout, &config, &inner),
            });
        }
        match &step {
            RestoreStep::Bootstrap(s) => {
                crate::executor::execute(&layout, &config, &opts.ringd, s).await?
            }
            RestoreStep::RestoreShoot { shoot, host } => {
                restore_shoot(&layout, &bucket, shoot, host).await?
            }
            RestoreStep::ClearStaleWorkloads { shoot } => {
                stale::clear(&layout.kubeconfig(shoot), shoot, &config.name).await?;
                let path = cleared_marker(&layout, shoot);
                seed::pki::write_private(&path, b"").map_err(RingError::from)?;
            }
        }
    }
    let status = crate::ring_status(&layout, &config).await?;
    let shoots = config
        .members
        .iter()
        .filter_map(|m| read_marker(&layout, &m.name))
        .collect();
    Ok(RestoreReport {
        ring: config.name.clone(),
        bucket: opts.bucket_url.clone(),
        state_dir: opts.dir.clone(),
        shoots,
        steps,
        total_secs: started.elapsed().as_secs_f64(),
        status,
        kubeconfigs: config
            .members
            .iter()
            .map(|m| (m.name.clone(), layout.kubeconfig(&m.name)))
            .collect(),
    })
}

/// The report as text.
pub fn render(r: &RestoreReport) -> String {
    let mut out = format!(
        "ring {} restored from {} in {:.1}s\n",
        r.ring, r.bucket, r.total_secs
    );
    for s in &r.shoots {
        out.push_str(&format!(
            "  {:<10} on {:<10} revision {} ({} + {} deltas{}) in {:.1}s\n",
            s.shoot,
            s.host,
            s.revision,
            s.full,
            s.deltas,
            if s.verified { ", verified" } else { "" },
            s.seconds
        ));
    }
    out.push('\n');
    out.push_str(&ringd::status::render(&r.status));
    out.push_str("\nkubeconfigs (the lost ring's kubeconfigs keep working too):\n");
    for (shoot, path) in &r.kubeconfigs {
        out.push_str(&format!(
            "  {shoot}: kubectl --kubeconfig {} get namespaces\n",
            path.display()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_file(dir: &Path, name: &str, byte: u8) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("{}\n", hex_of(byte))).unwrap();
        path
    }

    fn hex_of(byte: u8) -> String {
        format!("{byte:02x}").repeat(32)
    }

    fn keyed(file: &Path) -> RingConfig {
        RingConfig {
            bucket_encryption: Some(backup::config::EncryptionConfig {
                key_file: Some(file.to_path_buf()),
                ..Default::default()
            }),
            ..RingConfig::default()
        }
    }

    /// The DR runbook: the lost ring's stored ring.yaml names the generated
    /// key inside the lost state dir; the user's copy replaces it.
    #[test]
    fn the_key_copy_replaces_the_lost_rings_key_file() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = RingLayout {
            dir: tmp.path().join("new"),
        };
        let copy = key_file(tmp.path(), "copy.key", 7);
        let lost = tmp.path().join("lost/bucket.key");
        let config = with_given_key(keyed(&lost), &layout, &copy).unwrap();
        assert!(crate::bucket_key::uses_generated_key(&config, &layout));
        let installed = std::fs::read_to_string(layout.bucket_key()).unwrap();
        assert_eq!(installed.trim(), hex_of(7));
        // the lost file still there with the same key: the same
        let same = key_file(tmp.path(), "same.key", 7);
        assert!(with_given_key(keyed(&same), &layout, &copy).is_ok());
    }

    #[test]
    fn a_config_naming_another_key_or_an_env_key_is_refused_with_both_named() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = RingLayout {
            dir: tmp.path().join("new"),
        };
        let copy = key_file(tmp.path(), "copy.key", 7);
        let other = key_file(tmp.path(), "other.key", 9);
        let err = with_given_key(keyed(&other), &layout, &copy)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("other.key") && err.contains("copy.key"),
            "{err}"
        );
        let env = RingConfig {
            bucket_encryption: Some(backup::config::EncryptionConfig {
                key_env: Some("RING_KEY".into()),
                ..Default::default()
            }),
            ..RingConfig::default()
        };
        let err = with_given_key(env, &layout, &copy).unwrap_err().to_string();
        assert!(err.contains("$RING_KEY"), "{err}");
        assert!(!layout.bucket_key().exists(), "nothing installed");
    }

    /// A fresh ring places each shoot where its data was restored: on its
    /// predecessor, or (a self-hosted ring) on its first host. Restored onto
    /// the predecessor while the ring placed it elsewhere, a closed ring's
    /// shoot started there from an empty etcd (the full-ring-dr drill).
    #[test]
    fn a_shoot_is_restored_onto_the_member_the_new_ring_places_it_on() {
        let mut closed = RingConfig::default();
        closed.self_hosting.members = ["m1", "m2", "m3"].map(String::from).into();
        for (config, hosts) in [
            (RingConfig::default(), ["m3", "m1", "m2"]),
            (closed, ["m2", "m2", "m2"]),
        ] {
            for (shoot, host) in ["m1", "m2", "m3"].iter().zip(hosts) {
                assert_eq!(host_of(&config, shoot).as_deref(), Some(host), "{shoot}");
            }
        }
    }

    #[test]
    fn every_shoot_is_restored_onto_its_predecessor_before_any_ringd_starts() {
        let c = RingConfig::default();
        let mut o = Observed::default();
        let mut done = Marks::default();
        let mut seen = Vec::new();
        loop {
            let step = next_step(&c, &o, &done);
            seen.push(step.clone());
            match step {
                RestoreStep::RestoreShoot { shoot, host } => {
                    assert!(o.running.is_empty(), "no ringd before every restore");
                    assert_eq!(Some(host), host_of(&c, &shoot));
                    done.restored.insert(shoot);
                }
                RestoreStep::ClearStaleWorkloads { shoot } => {
                    assert!(o.kubeconfigs.contains(&shoot), "its API serves");
                    assert!(o.nodes_running.is_empty(), "before any node starts");
                    done.cleared.insert(shoot);
                }
                RestoreStep::Bootstrap(s) => {
                    if !o.pretend(s) {
                        break;
                    }
                }
            }
        }
        assert_eq!(
            seen[3],
            RestoreStep::RestoreShoot {
                shoot: "m1".into(),
                host: "m3".into()
            }
        );
        assert_eq!(
            seen[6],
            RestoreStep::Bootstrap(Step::StartMember("m1".into()))
        );
        // images, network and node configs while the control planes come
        // up; the lost ring's pods cleared from every shoot before the first
        // node starts; then 3 starts, 3 renewals, ready
        assert_eq!(seen[10], RestoreStep::Bootstrap(Step::BuildImages));
        assert_eq!(
            seen[13],
            RestoreStep::Bootstrap(Step::ConfigureNode("m1".into()))
        );
        assert!(
            matches!(&seen[16], RestoreStep::Bootstrap(Step::PublishKubeconfigs(s)) if s.len() == 3),
            "{:?}",
            seen[16]
        );
        assert_eq!(
            seen[17],
            RestoreStep::ClearStaleWorkloads { shoot: "m1".into() }
        );
        assert_eq!(
            seen[20],
            RestoreStep::Bootstrap(Step::StartNode("m1".into()))
        );
        assert_eq!(seen.len(), 3 + 3 + 3 + 1 + 2 + 1 + 3 + 1 + 3 + 3 + 3 + 2);
    }

    #[test]
    fn a_rerun_resumes_with_the_shoots_not_yet_restored() {
        let c = RingConfig::default();
        let o = Observed {
            config_written: true,
            pki_complete: true,
            member_configs_written: true,
            ..Default::default()
        };
        let done = Marks {
            restored: ["m1".to_string()].into(),
            ..Marks::default()
        };
        assert_eq!(
            next_step(&c, &o, &done),
            RestoreStep::RestoreShoot {
                shoot: "m2".into(),
                host: "m1".into()
            }
        );
    }
}
