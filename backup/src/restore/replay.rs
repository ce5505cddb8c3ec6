//! Replaying deltas into a temporary etcd on the restored data dir: one
//! transaction per recorded revision, in order, so the revisions are etcd's
//! own; leases granted with their recorded ids and kept alive meanwhile. The
//! temporary etcd does not fsync; its data dir is synced once it has stopped.
//!
//! When the full snapshot's revision is known exactly, the revisions are
//! first appended to etcd's own log (`wal.rs`), which etcd applies when it
//! starts; the transactions then only check what is left (and do it all
//! when the log could not be used).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseGrantOptions, PutOptions, Txn, TxnOp};
use tokio_util::sync::CancellationToken;

use super::prefetch::Prefetch;
use super::verify::{self, Checked};
use super::wal::{self, Requests};
use super::{fetch_delta, FullInfo, Outcome, RestoreOptions, RestoreReport, RestoreTarget};
use crate::catalog::{Entry, Plan};
use crate::codec::{DeltaMeta, HashKv};
use crate::delta::RevisionRecord;
use crate::etcd::{self, TempEtcd};
use crate::{BackupError, Result};

/// TTL of a lease a delta uses but whose TTL was not recorded.
pub(super) const DEFAULT_LEASE_TTL: i64 = 60;

/// The TTL to grant lease `id` with: the recorded one (`ttls`, from the
/// delta), else [`DEFAULT_LEASE_TTL`].
pub(super) fn lease_ttl(ttls: &BTreeMap<i64, i64>, id: i64) -> i64 {
    ttls.get(&id)
        .copied()
        .filter(|t| *t > 0)
        .unwrap_or(DEFAULT_LEASE_TTL)
}

/// The leases the temporary etcd holds, shared with their keeper.
type Leases = Arc<Mutex<BTreeSet<i64>>>;

/// A fetched and decoded delta.
type Fetched = Result<Delta>;

/// Keeps every lease of the temporary etcd alive while the replay runs (an
/// expiring lease would delete keys and shift the revisions).
fn keep_leases_alive(client: Client, leases: Leases, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            let ids: Vec<i64> = leases
                .lock()
                .map(|l| l.iter().copied().collect())
                .unwrap_or_default();
            for id in ids {
                let mut c = client.clone();
                let keep = async move {
                    let (mut keeper, mut stream) = c.lease_keep_alive(id).await?;
                    keeper.keep_alive().await?;
                    stream.message().await
                };
                let _ = tokio::time::timeout(Duration::from_secs(2), keep).await;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    });
}

/// Hands the revisions to etcd's log where it can, starts a temporary etcd
/// on `work/data` (which applies them), replays what is left and verifies,
/// stops it, syncs the data.
pub(super) async fn replay(
    opts: &RestoreOptions,
    work: &Path,
    plan: &Plan,
    full: &FullInfo,
    mut ahead: Option<Prefetch>,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &CancellationToken,
) -> Result<Outcome> {
    let data = work.join("data");
    let t = Instant::now();
    let mut logged = log_step(opts, &data, plan, full, &mut ahead, progress, cancel).await?;
    let snapshot_after = logged.as_ref().and_then(|l| l.snapshot_after);
    let log = work.join("etcd.log");
    let mut temp =
        TempEtcd::start_unsynced(&opts.etcd, &data, &opts.member.name, &log, snapshot_after)
            .await?;
    // etcd has applied its log once it answers
    let handed = t.elapsed().as_secs_f64();
    if logged.as_ref().is_some_and(|l| !l.requests.is_empty()) {
        progress(&format!(
            "etcd applied its log: {handed:.1}s from fetching the deltas to etcd answering"
        ));
    }
    let result = match deltas_to_replay(opts, plan, logged.as_mut(), ahead).await {
        Ok(deltas) => replay_into(&temp, opts, plan, full, deltas, progress, cancel).await,
        Err(e) => Err(e),
    };
    temp.stop().await;
    let mut outcome = result?;
    if let (Outcome::Replayed(report), Some(logged)) = (&mut outcome, &logged) {
        report.full_revision = logged.snapshot_revision;
        report.revisions_replayed += logged.requests.revisions;
        report.revisions_from_log = logged.requests.revisions;
        report.events_replayed += logged.requests.events;
        report.replay_seconds += handed;
    }
    let t = Instant::now();
    etcd::sync_tree(&data).map_err(crate::error::io_at("syncing", &data))?;
    progress(&format!(
        "synced the replayed data to disk in {:.1}s",
        t.elapsed().as_secs_f64()
    ));
    Ok(outcome)
}

/// A fetched and decoded delta, named.
pub(super) type Delta = (String, (DeltaMeta, Vec<RevisionRecord>));

/// The deltas handed to etcd's log, fetched once for the whole replay.
pub(super) struct Logged {
    deltas: Vec<Delta>,
    requests: Requests,
    /// The full snapshot's revision (etcd's before it applies the log).
    snapshot_revision: i64,
    /// Entries past the log's newest raft snapshot, when revisions were
    /// appended to it.
    snapshot_after: Option<u64>,
}

/// Appends the plan's revisions from the snapshot's on to the fresh log of
/// `data`. Nothing when the snapshot's exact revision is unknown (etcd was
/// written while it was taken), revisions may be skipped (`--allow-gap`) or
/// the log was appended to before (a resumed restore).
async fn log_step(
    opts: &RestoreOptions,
    data: &Path,
    plan: &Plan,
    full: &FullInfo,
    ahead: &mut Option<Prefetch>,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &CancellationToken,
) -> Result<Option<Logged>> {
    if full.base_revision != full.revision_after || opts.allow_gap || !plan.gaps.is_empty() {
        return Ok(None);
    }
    let Some(tail) = wal::read_tail(data)? else {
        return Ok(None);
    };
    let snapshot_revision = full.base_revision;
    let target = target_revision(opts.target, plan, snapshot_revision);
    if snapshot_revision > target {
        return Ok(None);
    }
    let t = Instant::now();
    let (mut deltas, rest, ahead_secs) = match ahead.take() {
        Some(p) => {
            let got = p.take(plan).await?;
            (got.deltas, got.rest, Some(got.seconds))
        }
        None => (Vec::new(), plan.deltas.clone(), None),
    };
    for d in &rest {
        if cancel.is_cancelled() {
            return Err(BackupError::Cancelled);
        }
        let fetched = fetch_delta(&opts.bucket, &d.name, opts.key.as_ref()).await?;
        deltas.push((d.name.clone(), fetched));
    }
    let fetched = match ahead_secs {
        Some(ahead) => format!(
            "{} deltas fetched and decoded ({} of them while the full snapshot was downloaded and restored, in {ahead:.1}s; {:.1}s waited here)",
            deltas.len(),
            deltas.len() - rest.len(),
            t.elapsed().as_secs_f64()
        ),
        None => format!(
            "{} deltas fetched and decoded in {:.1}s",
            deltas.len(),
            t.elapsed().as_secs_f64()
        ),
    };
    let t = Instant::now();
    let requests = wal::requests(&deltas, snapshot_revision, target);
    let mut snapshot_after = None;
    if !requests.is_empty() {
        let last = wal::append(&tail, &requests)?;
        snapshot_after = Some(tail.entries_past_snapshot(last));
        progress(&format!(
            "handed {} revisions ({} events) after revision {snapshot_revision} to etcd's log (entries up to {last}): {fetched}, the log written in {:.1}s",
            requests.revisions, requests.events, t.elapsed().as_secs_f64()
        ));
    }
    Ok(Some(Logged {
        deltas,
        requests,
        snapshot_revision,
        snapshot_after,
    }))
}

/// The revision to reach: the plan's; but a full snapshot taken while etcd
/// was written may hold a few revisions past its base, and when nothing newer
/// exists, "latest" is what it holds.
fn target_revision(target: RestoreTarget, plan: &Plan, restored_revision: i64) -> i64 {
    if target == RestoreTarget::Latest && plan.deltas.iter().all(|d| d.last <= restored_revision) {
        plan.target_revision.max(restored_revision)
    } else {
        plan.target_revision
    }
}

async fn replay_into(
    temp: &TempEtcd,
    opts: &RestoreOptions,
    plan: &Plan,
    full: &FullInfo,
    deltas: Deltas,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &CancellationToken,
) -> Result<Outcome> {
    let ep = temp.url.clone();
    let mut client = temp.client().await?;
    let restored_revision = etcd::status(&mut client, &ep).await?.revision;
    let target = target_revision(opts.target, plan, restored_revision);
    if restored_revision > target {
        progress(&format!(
            "{} holds revision {restored_revision}, past the target {target}: trying an older full snapshot",
            plan.full.name
        ));
        return Ok(Outcome::FullTooNew { restored_revision });
    }
    if restored_revision < full.base_revision {
        return Err(BackupError::Restore(format!(
            "{} restored to revision {restored_revision}, before its base revision {}: the snapshot does not hold what its name says",
            plan.full.name, full.base_revision
        )));
    }
    let leases = existing_leases(&mut client, &ep).await?;
    let stop_keeper = CancellationToken::new();
    keep_leases_alive(client.clone(), leases.clone(), stop_keeper.clone());
    let _stop_keeper = stop_keeper.drop_guard();
    // Download and decode the next deltas while the current one is applied
    // (fetched already when the log took them).
    let (mut rx, _abort) = deltas;

    let t = Instant::now();
    let mut r = Replayer::new(opts, plan, full, ep, leases, target, restored_revision);
    while let Some(item) = rx.recv().await {
        let (name, (meta, records)) = item?;
        r.delta(&mut client, &name, &meta, records, progress, cancel)
            .await?;
    }
    let replay_seconds = t.elapsed().as_secs_f64();
    r.summarize(replay_seconds, progress);
    let t = Instant::now();
    let mut checked = verify::verify(&mut client, &r).await?;
    progress(&format!(
        "verified in {:.1}s: revision {}, {} keys, HashKV {}",
        t.elapsed().as_secs_f64(),
        checked.reached,
        checked.keys,
        checked.hash_kv
    ));
    if opts.count_objects {
        checked.inspected = Some(verify::inspect(&mut client, &temp.url, checked.reached).await?);
    }
    Ok(Outcome::Replayed(r.report(
        opts,
        plan,
        replay_seconds,
        checked,
    )))
}

/// The leases the restored snapshot holds already.
async fn existing_leases(client: &mut Client, ep: &str) -> Result<Leases> {
    let existing: BTreeSet<i64> = etcd::call(ep, "listing leases", client.leases())
        .await?
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    Ok(Arc::new(Mutex::new(existing)))
}

/// The deltas to replay, in order, and what stops their fetching.
type Deltas = (tokio::sync::mpsc::Receiver<Fetched>, AbortOnDrop);

/// The plan's deltas for the transactions: those etcd's log took (the
/// transactions only check them), else those fetched ahead and the rest.
async fn deltas_to_replay(
    opts: &RestoreOptions,
    plan: &Plan,
    logged: Option<&mut Logged>,
    ahead: Option<Prefetch>,
) -> Result<Deltas> {
    Ok(match (logged, ahead) {
        (Some(l), _) => fetch_ahead(opts, std::mem::take(&mut l.deltas), Vec::new()),
        (None, Some(p)) => {
            let got = p.take(plan).await?;
            fetch_ahead(opts, got.deltas, got.rest)
        }
        (None, None) => fetch_ahead(opts, Vec::new(), plan.deltas.clone()),
    })
}

/// The deltas `fetched` already, then `rest` fetched in order two ahead of
/// the replay; the first failure ends the stream.
fn fetch_ahead(opts: &RestoreOptions, fetched: Vec<Delta>, rest: Vec<Entry>) -> Deltas {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    let bucket = opts.bucket.clone();
    let key = opts.key.clone();
    let fetcher = tokio::spawn(async move {
        for d in fetched {
            if tx.send(Ok(d)).await.is_err() {
                return;
            }
        }
        for entry in rest {
            let name = entry.name;
            let r = fetch_delta(&bucket, &name, key.as_ref())
                .await
                .map(|x| (name, x));
            let failed = r.is_err();
            if tx.send(r).await.is_err() || failed {
                return;
            }
        }
    });
    (rx, AbortOnDrop(fetcher))
}

/// What a recorded revision asks for.
enum Next {
    /// Already seen (an overlapping delta), in the snapshot, or applied before a crash.
    Skip,
    /// Past the target: the rest of this delta is not needed.
    Stop,
    Apply,
}

/// The replay's progress.
pub(super) struct Replayer {
    ep: String,
    allow_gap: bool,
    leases: Leases,
    pub(super) target: i64,
    restored_revision: i64,
    /// etcd's revision after the last transaction.
    current: i64,
    pub(super) expected_keys: i64,
    /// No revision was skipped: etcd's revisions are the recorded ones.
    pub(super) aligned: bool,
    gaps: Vec<(i64, i64)>,
    revisions: u64,
    events: u64,
    pub(super) recorded_hashes: Vec<HashKv>,
    pub(super) last_seen: i64,
    last_report: Instant,
}

#[cfg(test)]
impl Replayer {
    /// A replay that reached `target` with nothing skipped, the source's
    /// `expected_keys` known at `last_seen`.
    pub(super) fn finished_at(ep: String, target: i64, last_seen: i64, expected_keys: i64) -> Self {
        Replayer {
            ep,
            allow_gap: false,
            leases: Leases::default(),
            target,
            restored_revision: last_seen,
            current: target,
            expected_keys,
            aligned: true,
            gaps: Vec::new(),
            revisions: 0,
            events: 0,
            recorded_hashes: Vec::new(),
            last_seen,
            last_report: Instant::now(),
        }
    }
}

impl Replayer {
    fn new(
        opts: &RestoreOptions,
        plan: &Plan,
        full: &FullInfo,
        ep: String,
        leases: Leases,
        target: i64,
        restored_revision: i64,
    ) -> Self {
        Replayer {
            ep,
            allow_gap: opts.allow_gap,
            leases,
            target,
            restored_revision,
            current: restored_revision,
            expected_keys: full.keys,
            aligned: plan.gaps.is_empty(),
            gaps: Vec::new(),
            revisions: 0,
            events: 0,
            recorded_hashes: full.hash_kv.into_iter().collect(),
            last_seen: full.base_revision,
            last_report: Instant::now(),
        }
    }

    pub(super) fn ep(&self) -> &str {
        &self.ep
    }

    /// Replays one delta's records up to the target.
    async fn delta(
        &mut self,
        client: &mut Client,
        name: &str,
        meta: &DeltaMeta,
        records: Vec<RevisionRecord>,
        progress: &(dyn Fn(&str) + Sync),
        cancel: &CancellationToken,
    ) -> Result<()> {
        let ttls: BTreeMap<i64, i64> = meta.leases.iter().copied().collect();
        if let Some(h) = meta.hash_kv {
            if h.revision <= self.target {
                self.recorded_hashes.push(h);
            }
        }
        for r in records {
            match self.next(name, &r)? {
                Next::Skip => continue,
                Next::Stop => break,
                Next::Apply => {}
            }
            if cancel.is_cancelled() {
                return Err(BackupError::Cancelled);
            }
            self.apply(client, &r, &ttls, progress).await?;
        }
        Ok(())
    }

    /// Accounts for record `r` of delta `name` (gaps, key count) and says
    /// whether it is to be applied.
    fn next(&mut self, name: &str, r: &RevisionRecord) -> Result<Next> {
        if r.revision <= self.last_seen {
            return Ok(Next::Skip); // an overlapping delta
        }
        if r.revision > self.target {
            return Ok(Next::Stop);
        }
        if r.revision != self.last_seen + 1 {
            self.gaps.push((self.last_seen + 1, r.revision - 1));
            if !self.allow_gap {
                return Err(BackupError::Gap {
                    from: self.last_seen + 1,
                    to: r.revision - 1,
                    detail: format!("{name} does not continue the previous object"),
                });
            }
            self.aligned = false;
        }
        self.last_seen = r.revision;
        self.expected_keys += r.key_delta();
        if r.revision <= self.restored_revision || (self.aligned && r.revision <= self.current) {
            return Ok(Next::Skip); // already in the snapshot (or applied before a crash)
        }
        Ok(Next::Apply)
    }

    /// Applies record `r` and checks etcd's revision after it.
    async fn apply(
        &mut self,
        client: &mut Client,
        r: &RevisionRecord,
        ttls: &BTreeMap<i64, i64>,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<()> {
        let got = apply(client, &self.ep, r, ttls, &self.leases).await?;
        if self.aligned && got != r.revision {
            return Err(BackupError::Restore(format!(
                "replay diverged at revision {}: etcd answered revision {got}; the full snapshot and the deltas do not fit together",
                r.revision
            )));
        }
        self.current = got;
        self.revisions += 1;
        self.events += r.events.len() as u64;
        if self.last_report.elapsed() >= Duration::from_secs(5) {
            progress(&format!(
                "replayed up to revision {} ({} events)",
                r.revision, self.events
            ));
            self.last_report = Instant::now();
        }
        Ok(())
    }

    /// Tells what was replayed (and skipped, with `--allow-gap`).
    fn summarize(&self, seconds: f64, progress: &(dyn Fn(&str) + Sync)) {
        if !self.gaps.is_empty() && self.allow_gap {
            progress(&format!(
                "skipped missing revisions {:?} (--allow-gap): the result is not exact",
                self.gaps
            ));
        }
        progress(&format!(
            "replayed {} revisions ({} events) in {seconds:.1}s",
            self.revisions, self.events
        ));
    }

    fn report(
        self,
        opts: &RestoreOptions,
        plan: &Plan,
        replay_seconds: f64,
        checked: Checked,
    ) -> RestoreReport {
        let mut gaps = plan.gaps.clone();
        gaps.extend(self.gaps.iter().copied().filter(|g| !plan.gaps.contains(g)));
        RestoreReport {
            data_dir: opts.data_dir.clone(),
            target_revision: self.target,
            reached_revision: checked.reached,
            full: plan.full.name.clone(),
            full_revision: self.restored_revision,
            deltas: plan.deltas.len(),
            revisions_replayed: self.revisions,
            events_replayed: self.events,
            revisions_from_log: 0,
            replay_seconds,
            expected_keys: self.expected_keys,
            keys: checked.keys,
            hash_kv: checked.hash_kv,
            gaps,
            verified: self.aligned,
            total_seconds: 0.0,
            corrupt: Vec::new(),
            hash_kv_at_reached: checked.inspected.as_ref().map(|i| i.1),
            objects: checked.inspected.map(|i| i.0),
        }
    }
}

/// Aborts the task when dropped.
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Applies one recorded revision as one transaction (granting the leases it
/// uses first); returns etcd's revision after it. Transactions go one at a
/// time: etcd may apply concurrent requests in any order, and the revisions
/// must be the recorded ones.
async fn apply(
    client: &mut Client,
    ep: &str,
    r: &RevisionRecord,
    ttls: &BTreeMap<i64, i64>,
    leases: &Mutex<BTreeSet<i64>>,
) -> Result<i64> {
    let mut ops = Vec::with_capacity(r.events.len());
    for e in &r.events {
        if e.delete {
            ops.push(TxnOp::delete(e.key.clone(), None));
            continue;
        }
        let mut opts = None;
        if e.lease != 0 {
            let known = leases.lock().map(|l| l.contains(&e.lease)).unwrap_or(false);
            if !known {
                let ttl = lease_ttl(ttls, e.lease);
                match client
                    .lease_grant(ttl, Some(LeaseGrantOptions::new().with_id(e.lease)))
                    .await
                {
                    Ok(_) => {}
                    Err(err) if etcd::is_lease_taken(&err) => {}
                    Err(err) => {
                        return Err(etcd::err(ep, &format!("granting lease {:x}", e.lease), err))
                    }
                }
                if let Ok(mut l) = leases.lock() {
                    l.insert(e.lease);
                }
            }
            opts = Some(PutOptions::new().with_lease(e.lease));
        }
        ops.push(TxnOp::put(e.key.clone(), e.value.clone(), opts));
    }
    let resp = etcd::call(
        ep,
        &format!("replaying revision {}", r.revision),
        client.txn(Txn::new().and_then(ops)),
    )
    .await?;
    Ok(resp.header().map_or(0, |h| h.revision()))
}
