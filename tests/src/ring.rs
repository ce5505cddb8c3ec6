//! A ring of real `ringd` processes on loopback, for end-to-end tests.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use ringd::client::AdminClient;
use ringd::config::Timing;
use ringd::localring::LocalRing;
use ringd::status::RingStatus;

use crate::Sandbox;

/// The `ringd` binary next to this test binary (built by `scripts/test`).
pub fn ringd_bin() -> PathBuf {
    let ctl = crate::ringctl();
    let path = ctl.with_file_name("ringd");
    assert!(
        path.exists(),
        "{} is missing: build it first with `cargo build --workspace --bins` (scripts/test does)",
        path.display()
    );
    path
}

/// The environment that runs a process (and every process it starts that
/// reads the clock through libc, as ringd and ring-agent do) with its wall
/// and monotonic clocks shifted by `offset` (libfaketime's syntax, e.g.
/// "-5s"), or a panic telling how to install Debian's `faketime`.
pub fn faketime(offset: &str) -> Vec<(String, String)> {
    scenarios::procs::faketime_env(offset).unwrap_or_else(|e| panic!("{e}"))
}

/// One member's process and files.
pub struct MemberProc {
    pub name: String,
    pub id: u64,
    pub address: String,
    pub config: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

impl MemberProc {
    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

/// `n` ringd members on loopback with their own PKI; killed on drop.
pub struct RingFixture {
    pub sandbox: Sandbox,
    pub pki: PathBuf,
    pub members: Vec<MemberProc>,
    pub timing: Timing,
    layout: LocalRing,
}

impl RingFixture {
    /// Writes the PKI and the configs of `n` members named m1..mn; members listed
    /// in `with_seed` host control planes (a local seed in the sandbox).
    pub fn new(n: usize, with_seed: &[&str]) -> Self {
        Self::with_timing(n, with_seed, Timing::default())
    }

    /// [`RingFixture::new`] with the members' timing.
    pub fn with_timing(n: usize, with_seed: &[&str], timing: Timing) -> Self {
        let sandbox = Sandbox::new();
        let layout =
            LocalRing::write(sandbox.path(), n, with_seed, timing).expect("local ring files");
        let members = layout
            .members
            .iter()
            .map(|m| MemberProc {
                name: m.name.clone(),
                id: m.id,
                address: m.address.clone(),
                config: m.config.clone(),
                log: m.log.clone(),
                child: None,
            })
            .collect();
        RingFixture {
            sandbox,
            pki: layout.pki.clone(),
            members,
            timing: layout.timing,
            layout,
        }
    }

    /// Starts member `i` (0-based).
    pub fn start(&mut self, i: usize) {
        self.start_with_env(i, &[]);
    }

    /// Starts member `i` with extra environment variables (e.g. [`faketime`]).
    pub fn start_with_env(&mut self, i: usize, env: &[(&str, &str)]) {
        assert!(
            self.members[i].child.is_none(),
            "{} already runs",
            self.members[i].name
        );
        let child = self
            .layout
            .spawn_with_env(&ringd_bin(), i, env)
            .expect("start ringd");
        self.members[i].child = Some(child);
    }

    /// Writes the config of a member that joins later; returns its index.
    pub fn add_joiner(&mut self, name: &str) -> usize {
        let i = self
            .layout
            .write_joiner(name, false)
            .expect("joiner config");
        let m = &self.layout.members[i];
        self.members.push(MemberProc {
            name: m.name.clone(),
            id: m.id,
            address: m.address.clone(),
            config: m.config.clone(),
            log: m.log.clone(),
            child: None,
        });
        i
    }

    /// Starts every member.
    pub fn start_all(&mut self) {
        for i in 0..self.members.len() {
            self.start(i);
        }
    }

    /// Sends `signal` to member `i`'s process group.
    pub fn signal(&self, i: usize, signal: i32) {
        if let Some(pid) = self.members[i].pid() {
            // SAFETY: plain syscall on our own child's group.
            unsafe {
                libc::kill(-(pid as i32), signal);
            }
        }
    }

    /// kill -9 of member `i` (its ringd and any control plane it supervises in-process).
    pub fn kill(&mut self, i: usize) {
        self.signal(i, libc::SIGKILL);
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.wait();
            scenarios::procs::remove_faketime_shm(c.id());
        }
    }

    /// SIGTERM and wait (bounded) for member `i` to exit.
    pub fn stop(&mut self, i: usize) {
        self.signal(i, libc::SIGTERM);
        if let Some(mut c) = self.members[i].child.take() {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while c.try_wait().ok().flatten().is_none() {
                if std::time::Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!("{} ignored SIGTERM for 30s", self.members[i].name);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            scenarios::procs::remove_faketime_shm(c.id());
        }
    }

    /// An admin client to member `i`.
    pub fn client(&self, i: usize) -> AdminClient {
        AdminClient::connect(&self.members[i].address, &self.pki).expect("admin client")
    }

    /// Member `i`'s status.
    pub async fn status(&self, i: usize) -> Result<RingStatus, ringd::RingError> {
        self.client(i).status().await
    }

    /// Polls member `i` until `check` holds; panics with `what` and the member's log tail after `timeout`.
    pub async fn wait_status(
        &self,
        i: usize,
        what: &str,
        timeout: Duration,
        check: impl FnMut(&RingStatus) -> bool,
    ) -> RingStatus {
        match ringd::client::wait_status(&self.members[i].address, &self.pki, timeout, check).await
        {
            Ok(s) => s,
            Err(e) => panic!(
                "member {} never showed {what}: {e}\nlast lines of its log:\n{}",
                self.members[i].name,
                seed::ShootLayout::tail(&self.members[i].log, 20)
            ),
        }
    }

    /// After the host of `shoot` was stopped: watches, every 50 ms, whether
    /// its control plane still `serves`, and (through member `observer`)
    /// when the first failover of `shoot` became `Pending`, until both are
    /// known or `within` passed (a panic). Returns (the leader's `Pending`
    /// time, the last time it was seen serving), unix ms: a replacement may
    /// begin only after the old control plane stopped.
    pub async fn pending_and_last_served(
        &self,
        observer: usize,
        shoot: &str,
        serves: impl Fn() -> bool,
        within: Duration,
    ) -> (u64, u64) {
        let deadline = std::time::Instant::now() + within;
        let mut next_status = std::time::Instant::now();
        let (mut last_served, mut pending) = (crate::now_ms(), None);
        while pending.is_none() || serves() {
            assert!(
                std::time::Instant::now() < deadline,
                "no failover of {shoot} became Pending (or its control plane never stopped) within {within:?}"
            );
            if serves() {
                last_served = crate::now_ms();
            }
            if std::time::Instant::now() >= next_status {
                next_status = std::time::Instant::now() + Duration::from_millis(200);
                if let Ok(s) = self.status(observer).await {
                    pending = pending_at(&s.operations, shoot);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (pending.unwrap_or(0), last_served)
    }

    /// Waits until member `i` knows a leader; returns the leader's index.
    pub async fn leader_seen_by(&self, i: usize, timeout: Duration) -> usize {
        let s = self
            .wait_status(i, "a leader and a bootstrapped ring", timeout, |s| {
                s.leader.is_some() && !s.members.is_empty()
            })
            .await;
        let name = s.leader.unwrap();
        self.members
            .iter()
            .position(|m| m.name == name)
            .expect("leader is a member")
    }

    /// Member index by name.
    pub fn index(&self, name: &str) -> usize {
        self.members
            .iter()
            .position(|m| m.name == name)
            .expect("member")
    }

    /// The sandbox dir of member `i`'s seed.
    pub fn seed_dir(&self, i: usize) -> PathBuf {
        self.sandbox.path().join(&self.members[i].name).join("seed")
    }

    /// The log of member `i`.
    pub fn log(&self, i: usize) -> &Path {
        &self.members[i].log
    }
}

impl Drop for RingFixture {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.signal(i, libc::SIGCONT);
            self.kill(i);
        }
    }
}

/// When the first failover of `shoot` became `Pending` (by the proposing
/// leader's clock, never the stopped member's).
fn pending_at(ops: &[ringd::state::Operation], shoot: &str) -> Option<u64> {
    let op = ops.iter().find(|o| o.shoot() == shoot)?;
    op.history
        .iter()
        .find(|h| h.step == ringd::state::OperationStep::Pending)
        .map(|h| h.at_ms)
}
