//! What the figures share: measuring a child process, writing data into
//! etcd, a temporary etcd and a continuous backup of it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::Client;
use tokio_util::sync::CancellationToken;

use crate::config::{BackupConfig, BucketConfig};
use crate::error::io_at;
use crate::etcd::{self, TempEtcd};
use crate::runner::Backup;
use crate::{BackupError, Result};

/// Runs a child to completion: (wall seconds, peak RSS MiB, stdout).
pub(super) async fn measure(mut cmd: Command) -> Result<(f64, f64, String)> {
    let what = format!("{cmd:?}");
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| BackupError::Tool {
                program: what.clone(),
                message: e.to_string(),
            })?;
        let pid = child.id() as libc::pid_t;
        let (mut stdout, mut stderr) = (child.stdout, child.stderr);
        let out_reader = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(o) = stdout.as_mut() {
                let _ = std::io::Read::read_to_string(o, &mut s);
            }
            s
        });
        let mut err_text = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = std::io::Read::read_to_string(e, &mut err_text);
        }
        let mut status = 0;
        // SAFETY: plain syscall on our own child; rusage is a plain C struct.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        let secs = started.elapsed().as_secs_f64();
        let out = out_reader.join().unwrap_or_default();
        if r < 0 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            return Err(BackupError::Tool {
                program: what,
                message: err_text.trim().to_string(),
            });
        }
        Ok((secs, usage.ru_maxrss as f64 / 1024.0, out))
    })
    .await
    .map_err(|e| BackupError::Tool {
        program: "benchmark child".into(),
        message: e.to_string(),
    })?
}

/// A value of `len` bytes, half random (like encoded objects), half repetitive.
pub(super) fn value(len: usize, i: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while v.len() < len / 2 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    let text = format!("{{\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"bench-{i}\",\"namespace\":\"default\"}}}}");
    while v.len() < len {
        v.extend_from_slice(text.as_bytes());
    }
    v.truncate(len);
    v
}

/// Writes `count` keys from `start` with `concurrency` puts in flight.
pub(super) async fn fill(
    client: &Client,
    start: u64,
    count: u64,
    len: usize,
    concurrency: u64,
) -> Result<()> {
    let next = Arc::new(AtomicU64::new(start));
    let end = start + count;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (mut c, next) = (client.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return Ok(());
                }
                c.put(format!("/registry/bench/{i:09}"), value(len, i), None)
                    .await
                    .map_err(|e| etcd::err("bench etcd", "put", e))?;
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| BackupError::Catalog(e.to_string()))??;
    }
    Ok(())
}

/// A temporary etcd with its data and log under `dir`.
pub(super) async fn start_etcd(dir: &Path, name: &str) -> Result<TempEtcd> {
    let etcd_bin = etcd::find_binary("etcd", None)?;
    std::fs::create_dir_all(dir).map_err(io_at("creating", dir))?;
    TempEtcd::start(&etcd_bin, &dir.join("data"), name, &dir.join("etcd.log")).await
}

/// A running backup: its progress, its stop token and its task.
pub(super) type Running = (
    tokio::sync::watch::Receiver<crate::Progress>,
    CancellationToken,
    tokio::task::JoinHandle<Result<()>>,
);

/// A continuous backup of `e` into `dir/bucket` (default schedule, no
/// periodic HashKV), running until the token is cancelled.
pub(super) fn start_backup(e: &TempEtcd, dir: &Path) -> Result<Running> {
    let mut c = BackupConfig::new(
        "bench",
        e.config(),
        BucketConfig::url(format!("file://{}", dir.join("bucket").display())),
    );
    c.spool.dir = Some(dir.join("spool"));
    c.schedule.hash_kv_interval_secs = 0;
    let b = Backup::new(c)?;
    let progress = b.progress();
    let stop = CancellationToken::new();
    let task = tokio::spawn(b.run(stop.clone()));
    Ok((progress, stop, task))
}

/// Waits until the backup reports `revision` durable.
pub(super) async fn wait_durable(
    progress: &mut tokio::sync::watch::Receiver<crate::Progress>,
    revision: i64,
    timeout: Duration,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    while progress.borrow_and_update().durable_revision < revision {
        if tokio::time::timeout_at(deadline, progress.changed())
            .await
            .is_err()
        {
            return Err(BackupError::Catalog(format!(
                "the backup did not reach revision {revision} within {timeout:?}"
            )));
        }
    }
    Ok(())
}

/// `etcdctl snapshot save` of `e` into `out` (with `e`'s client certificate).
pub(super) fn snapshot_save_cmd(e: &TempEtcd, out: &Path) -> Result<Command> {
    let mut cmd = Command::new(etcd::find_binary("etcdctl", None)?);
    cmd.arg(format!("--endpoints={}", e.url))
        .args(tls_flags(e, ["cacert", "cert", "key"]))
        .args(["snapshot", "save"])
        .arg(out);
    Ok(cmd)
}

/// `ringctl`'s flags to reach `e` (its endpoint and client certificate).
pub(super) fn ringctl_etcd_flags(e: &TempEtcd) -> Vec<String> {
    let mut flags = vec![format!("--etcd-endpoint={}", e.url)];
    flags.extend(tls_flags(e, ["etcd-ca", "etcd-cert", "etcd-key"]));
    flags
}

/// `--CA=file --CERT=file --KEY=file` for `e`'s CA and client certificate,
/// under a tool's own flag names.
fn tls_flags(e: &TempEtcd, names: [&str; 3]) -> Vec<String> {
    let c = e.config();
    names
        .into_iter()
        .zip([c.ca_file, c.cert_file, c.key_file])
        .filter_map(|(name, file)| file.map(|f| format!("--{name}={}", f.display())))
        .collect()
}

/// What one `ringctl backup restore` took.
pub(super) struct RingRestore {
    pub(super) secs: f64,
    pub(super) rss_mib: f64,
    pub(super) replay_secs: f64,
    pub(super) events_per_sec: f64,
}

/// `ringctl backup restore` of `bucket` as a child; the restored data dir is
/// removed afterwards.
pub(super) async fn ring_restore(
    ringctl: &Path,
    bucket: &Path,
    data_dir: &Path,
    work: Option<&Path>,
) -> Result<RingRestore> {
    let mut cmd = Command::new(ringctl);
    cmd.args(["backup", "restore", "--shoot", "bench", "-o", "json"])
        .arg(format!("--bucket=file://{}", bucket.display()))
        .arg(format!("--data-dir={}", data_dir.display()));
    if let Some(w) = work {
        cmd.arg(format!("--work-dir={}", w.display()));
    }
    let (secs, rss_mib, stdout) = measure(cmd).await?;
    let v: serde_json::Value = serde_json::from_str(&stdout).map_err(|e| BackupError::Tool {
        program: "ringctl backup restore".into(),
        message: format!("unreadable report: {e}"),
    })?;
    if v["verified"].as_bool() != Some(true) {
        return Err(BackupError::Verify(format!(
            "the benchmark restore was not verified: {stdout}"
        )));
    }
    let events = v["eventsReplayed"].as_f64().unwrap_or(0.0);
    let replay_secs = v["replaySeconds"].as_f64().unwrap_or(0.0);
    let _ = std::fs::remove_dir_all(data_dir);
    Ok(RingRestore {
        secs,
        rss_mib,
        replay_secs,
        events_per_sec: events / replay_secs.max(1e-9),
    })
}
