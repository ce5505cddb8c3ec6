//! The data of a handover: the final etcd snapshot (with its revision and
//! `HashKV`), the shoot's PKI and spec; restoring and verifying on the target.

use std::collections::BTreeMap;
use std::path::{Component as PathComponent, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use seed::pki::Leaf;
use seed::{ControlPlaneSpec, ShootLayout};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use crate::{MigrateError, Result};

/// What the source recorded about its final snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    /// etcd's revision when the writers had stopped.
    pub revision: i64,
    /// etcd's HashKV at that revision.
    pub hash_kv: u32,
    /// Snapshot size in bytes.
    pub size: u64,
    pub taken_at_ms: u64,
    /// Objects per resource type at `revision` (keys under `/registry/`).
    #[serde(default)]
    pub objects: BTreeMap<String, u64>,
}

pub use backup::objects::{count_objects, resource_of};

/// `<shoot dir>/handover`.
pub fn dir(layout: &ShootLayout) -> PathBuf {
    layout.dir.join("handover")
}

/// The final snapshot file.
pub fn snapshot_path(layout: &ShootLayout) -> PathBuf {
    dir(layout).join("snapshot.db")
}

fn info_path(layout: &ShootLayout) -> PathBuf {
    dir(layout).join("info.json")
}

fn restored_marker(layout: &ShootLayout) -> PathBuf {
    dir(layout).join("restored")
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> MigrateError {
    let what = what.into();
    move |source| MigrateError::Io { what, source }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The recorded snapshot info, if the snapshot is complete.
pub fn read_info(layout: &ShootLayout) -> Option<SnapshotInfo> {
    let info: SnapshotInfo =
        serde_json::from_slice(&std::fs::read(info_path(layout)).ok()?).ok()?;
    let size = std::fs::metadata(snapshot_path(layout)).ok()?.len();
    (size == info.size).then_some(info)
}

/// An etcd client for the shoot's etcd (TLS with the shoot's etcd client certificate).
pub async fn etcd(layout: &ShootLayout, spec: &ControlPlaneSpec) -> Result<etcd_client::Client> {
    let err = |message: String| MigrateError::Etcd {
        shoot: spec.shoot.clone(),
        message,
    };
    let pki = layout.pki();
    let read =
        |p: &Path| std::fs::read_to_string(p).map_err(io(format!("reading {}", p.display())));
    let ca = read(&pki.ca().cert)?;
    let client = pki.leaf(Leaf::EtcdClient);
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(ca))
        .identity(etcd_client::Identity::from_pem(
            read(&client.cert)?,
            read(&client.key)?,
        ))
        .domain_name(spec.endpoint.address.to_string());
    let options = etcd_client::ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(std::time::Duration::from_secs(3))
        .with_timeout(std::time::Duration::from_secs(30));
    etcd_client::Client::connect([spec.endpoint.etcd_url()], Some(options))
        .await
        .map_err(|e| err(e.to_string()))
}

/// Takes the final snapshot of a shoot whose writers are stopped: records the
/// revision and HashKV, streams the snapshot to disk (bounded memory), fsyncs.
pub async fn take_final_snapshot(
    layout: &ShootLayout,
    spec: &ControlPlaneSpec,
) -> Result<SnapshotInfo> {
    let err = |message: String| MigrateError::Etcd {
        shoot: spec.shoot.clone(),
        message,
    };
    let mut client = etcd(layout, spec).await?;
    let status = client
        .status()
        .await
        .map_err(|e| err(format!("status: {e}")))?;
    let revision = status.header().map_or(0, |h| h.revision());
    let hash_kv = client
        .hash_kv(revision)
        .await
        .map_err(|e| err(format!("HashKV at {revision}: {e}")))?
        .hash();
    let objects = count_objects(&mut client, revision)
        .await
        .map_err(|e| err(format!("counting objects at {revision}: {e}")))?;
    seed::pki::create_private_dir(&dir(layout))?;
    let path = snapshot_path(layout);
    let tmp = path.with_extension("part");
    let mut file = tokio::fs::File::create(&tmp)
        .await
        .map_err(io(format!("creating {}", tmp.display())))?;
    let mut stream = client
        .snapshot()
        .await
        .map_err(|e| err(format!("snapshot: {e}")))?;
    let mut size = 0u64;
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|e| err(format!("snapshot stream: {e}")))?
    {
        file.write_all(chunk.blob())
            .await
            .map_err(io(format!("writing {}", tmp.display())))?;
        size += chunk.blob().len() as u64;
    }
    file.sync_all()
        .await
        .map_err(io(format!("syncing {}", tmp.display())))?;
    drop(file);
    std::fs::rename(&tmp, &path).map_err(io(format!("renaming {}", tmp.display())))?;
    let info = SnapshotInfo {
        revision,
        hash_kv,
        size,
        taken_at_ms: now_ms(),
        objects,
    };
    write_info(layout, &info)?;
    tracing::info!(shoot = %spec.shoot, revision, size, "final snapshot taken");
    Ok(info)
}

/// Records the final snapshot's info next to `snapshot.db` (the snapshot is
/// complete once both are there and its size matches).
pub fn write_info(layout: &ShootLayout, info: &SnapshotInfo) -> Result<()> {
    let json = serde_json::to_vec_pretty(info).map_err(|e| MigrateError::Handover {
        shoot: layout.dir.display().to_string(),
        message: format!("encoding the snapshot info: {e}"),
    })?;
    seed::pki::create_private_dir(&dir(layout))?;
    Ok(seed::pki::write_private(&info_path(layout), &json)?)
}

/// Files the target needs, relative to the shoot dir: spec, PKI, snapshot and its info.
pub fn files(layout: &ShootLayout) -> Result<Vec<PathBuf>> {
    let mut out = vec![PathBuf::from("shoot.json")];
    let pki = layout.dir.join("pki");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&pki)
        .map_err(io(format!("listing {}", pki.display())))?
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| PathBuf::from("pki").join(e.file_name()))
        .collect();
    names.sort();
    out.extend(names);
    out.push(PathBuf::from("handover/snapshot.db"));
    out.push(PathBuf::from("handover/info.json"));
    Ok(out)
}

/// `layout.dir/rel`, refusing anything that could leave the shoot dir.
pub fn safe_path(layout: &ShootLayout, rel: &str) -> Result<PathBuf> {
    let p = Path::new(rel);
    let ok = !rel.is_empty()
        && p.components()
            .all(|c| matches!(c, PathComponent::Normal(_)));
    if !ok {
        return Err(MigrateError::Handover {
            shoot: layout.dir.display().to_string(),
            message: format!("refusing the path {rel:?} (must be relative, without '..')"),
        });
    }
    Ok(layout.dir.join(p))
}

/// Whether the snapshot was restored into the shoot's etcd data dir.
pub fn restored(layout: &ShootLayout) -> bool {
    restored_marker(layout).exists()
}

/// Restores the fetched snapshot into a fresh etcd data dir (an old one is kept
/// aside) with `etcdutl snapshot restore`, which also checks the snapshot's
/// hash. The revision stays the source's (no `--bump-revision`): the source
/// took the snapshot after its writers stopped, so no client saw a later
/// revision, and [`verify`] reads `HashKV` at exactly that revision.
pub async fn restore(layout: &ShootLayout, spec: &ControlPlaneSpec, etcdutl: &Path) -> Result<()> {
    let err = |message: String| MigrateError::Restore {
        shoot: spec.shoot.clone(),
        message,
    };
    let Some(info) = read_info(layout) else {
        return Err(err(
            "the snapshot or its info is missing or incomplete".into()
        ));
    };
    let data = layout.etcd_data();
    if data.exists() {
        let aside = layout.dir.join(format!("etcd.replaced-{}", now_ms()));
        std::fs::rename(&data, &aside).map_err(io(format!("moving {} aside", data.display())))?;
    }
    let peer = spec.endpoint.etcd_peer_url();
    let out = tokio::process::Command::new(etcdutl)
        .arg("snapshot")
        .arg("restore")
        .arg(snapshot_path(layout))
        .arg(format!("--name={}", spec.shoot))
        .arg(format!("--data-dir={}", data.display()))
        .arg(format!("--initial-cluster={}={peer}", spec.shoot))
        .arg(format!("--initial-cluster-token=ring-{}", spec.shoot))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .output()
        .await
        .map_err(io(format!("running {}", etcdutl.display())))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let why = backup::etcd::reason(&stderr).unwrap_or_else(|| stderr.trim().to_string());
        return Err(err(format!("etcdutl snapshot restore: {why}")));
    }
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700));
    seed::pki::write_private(
        &restored_marker(layout),
        info.revision.to_string().as_bytes(),
    )?;
    tracing::info!(shoot = %spec.shoot, revision = info.revision, "snapshot restored");
    Ok(())
}

/// Checks the running target: its revision did not go back, etcd's HashKV at the
/// snapshot's revision equals the source's, and so does the number of objects of
/// every resource type. Returns those counts.
pub async fn verify(
    layout: &ShootLayout,
    spec: &ControlPlaneSpec,
    info: &SnapshotInfo,
) -> Result<BTreeMap<String, u64>> {
    let err = |message: String| MigrateError::Verify {
        shoot: spec.shoot.clone(),
        message,
    };
    let mut client = etcd(layout, spec).await?;
    let status = client
        .status()
        .await
        .map_err(|e| err(format!("status: {e}")))?;
    let revision = status.header().map_or(0, |h| h.revision());
    if revision < info.revision {
        return Err(err(format!(
            "revision {revision} is behind the source's final revision {}",
            info.revision
        )));
    }
    let hash = client
        .hash_kv(info.revision)
        .await
        .map_err(|e| err(format!("HashKV at {}: {e}", info.revision)))?
        .hash();
    if hash != info.hash_kv {
        return Err(err(format!(
            "HashKV at revision {} is {hash:#x}, the source had {:#x}",
            info.revision, info.hash_kv
        )));
    }
    let objects = count_objects(&mut client, info.revision)
        .await
        .map_err(|e| err(format!("counting objects at {}: {e}", info.revision)))?;
    if !info.objects.is_empty() && objects != info.objects {
        let differ: Vec<String> = info
            .objects
            .keys()
            .chain(objects.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|k| info.objects.get(*k) != objects.get(*k))
            .map(|k| {
                format!(
                    "{k}: source {} target {}",
                    info.objects.get(k).copied().unwrap_or(0),
                    objects.get(k).copied().unwrap_or(0)
                )
            })
            .collect();
        return Err(err(format!(
            "object counts at revision {} differ: {}",
            info.revision,
            differ.join(", ")
        )));
    }
    Ok(objects)
}

fn operation_marker(layout: &ShootLayout) -> PathBuf {
    dir(layout).join("operation")
}

/// Marks which operation the handover files belong to; stale files of an
/// older operation are removed first.
pub fn claim(layout: &ShootLayout, op: u64) -> Result<()> {
    if claimed(layout) != Some(op) {
        clear(layout);
        seed::pki::create_private_dir(&dir(layout))?;
        seed::pki::write_private(&operation_marker(layout), op.to_string().as_bytes())?;
    }
    Ok(())
}

/// The operation the handover files belong to.
pub fn claimed(layout: &ShootLayout) -> Option<u64> {
    std::fs::read_to_string(operation_marker(layout))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Removes the handover files (after the migration is done).
pub fn clear(layout: &ShootLayout) {
    let _ = std::fs::remove_dir_all(dir(layout));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_cannot_escape_the_shoot_dir() {
        let layout = ShootLayout {
            dir: "/s/shoots/a".into(),
        };
        assert_eq!(
            safe_path(&layout, "pki/ca.crt").unwrap(),
            PathBuf::from("/s/shoots/a/pki/ca.crt")
        );
        for bad in ["", "../x", "/etc/passwd", "pki/../../x", "./pki"] {
            assert!(safe_path(&layout, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_new_operation_clears_the_files_of_an_older_one() {
        let d = tempfile::tempdir().unwrap();
        let layout = ShootLayout {
            dir: d.path().into(),
        };
        assert_eq!(claimed(&layout), None);
        claim(&layout, 4).unwrap();
        std::fs::write(snapshot_path(&layout), b"old").unwrap();
        claim(&layout, 4).unwrap();
        assert!(snapshot_path(&layout).exists(), "same operation: kept");
        claim(&layout, 5).unwrap();
        assert_eq!(claimed(&layout), Some(5));
        assert!(!snapshot_path(&layout).exists(), "older operation: cleared");
    }

    #[test]
    fn incomplete_snapshot_has_no_info() {
        let d = tempfile::tempdir().unwrap();
        let layout = ShootLayout {
            dir: d.path().into(),
        };
        std::fs::create_dir_all(dir(&layout)).unwrap();
        let info = SnapshotInfo {
            revision: 5,
            hash_kv: 1,
            size: 10,
            taken_at_ms: 0,
            objects: BTreeMap::new(),
        };
        std::fs::write(info_path(&layout), serde_json::to_vec(&info).unwrap()).unwrap();
        std::fs::write(snapshot_path(&layout), [0u8; 4]).unwrap();
        assert_eq!(
            read_info(&layout),
            None,
            "a truncated snapshot is not complete"
        );
        std::fs::write(snapshot_path(&layout), [0u8; 10]).unwrap();
        assert_eq!(read_info(&layout), Some(info));
    }
}
