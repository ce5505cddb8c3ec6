//! Tests of [`super`]: the supervisor with real child processes.
use super::*;

/// A child that prints more than a pipe holds still finishes, and all of
/// its output comes back (it blocked on a full pipe until killed before:
/// `kubectl get` of a few thousand objects in the migration test).
#[test]
fn run_bounded_collects_output_larger_than_a_pipe() {
    let mut cmd = std::process::Command::new("head");
    cmd.args(["-c", "1000000", "/dev/zero"]);
    let out = run_bounded(&mut cmd, Duration::from_secs(20)).unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert_eq!(out.stdout.len(), 1_000_000);
    let mut slow = std::process::Command::new("sh");
    slow.args(["-c", "echo waiting >&2; exec sleep 30"]);
    let e = run_bounded(&mut slow, Duration::from_secs(2)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    assert!(e.to_string().contains("stderr: waiting"), "{e}");
}

/// kube-apiserver's and etcd's graces are capped (they drain open
/// streams); every other component gets the supervisor's.
#[test]
fn only_kube_apiserver_and_etcd_have_their_stop_grace_capped() {
    let grace = Duration::from_secs(5);
    for c in Component::ALL {
        let want = match c {
            Component::KubeApiserver => API_STOP_GRACE,
            Component::Etcd => ETCD_STOP_GRACE,
            _ => grace,
        };
        assert_eq!(c.stop_grace(grace), want, "{c:?}");
    }
    let short = Duration::from_millis(300);
    assert_eq!(Component::KubeApiserver.stop_grace(short), short);
}

#[test]
fn backoff_doubles_caps_and_resets() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
    let got: Vec<_> = (0..4).map(|_| b.next_delay().as_millis()).collect();
    assert_eq!(got, [100, 200, 350, 350]);
    b.reset();
    assert_eq!(b.next_delay().as_millis(), 100);
}

fn sh(script: &str, log: PathBuf) -> ComponentSpec {
    ComponentSpec {
        component: Component::KubeScheduler,
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        log,
        netns: None,
    }
}

fn fast() -> SupervisorTuning {
    SupervisorTuning {
        restart_initial: Duration::from_millis(20),
        restart_max: Duration::from_millis(50),
        healthy_after: Duration::from_secs(60),
        stop_grace: Duration::from_millis(500),
        permanent_exit: None,
    }
}

async fn wait_for(
    rx: &mut watch::Receiver<States>,
    what: &str,
    f: impl Fn(&ComponentState) -> bool,
) {
    let res = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if rx.borrow().get(&Component::KubeScheduler).is_some_and(&f) {
                return;
            }
            rx.changed().await.unwrap();
        }
    })
    .await;
    assert!(
        res.is_ok(),
        "timed out waiting for {what}: {:?}",
        rx.borrow()
    );
}

#[tokio::test]
async fn crashing_child_is_restarted_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = watch::channel(States::new());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(supervise(
        sh("exit 3", dir.path().join("log")),
        cancel.clone(),
        tx,
        fast(),
    ));
    wait_for(&mut rx, "3 restarts", |s| s.restarts >= 3).await;
    assert_eq!(
        rx.borrow()[&Component::KubeScheduler].last_exit.as_deref(),
        Some("exit status 3")
    );
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(
        log.matches("=== ring: starting kube-scheduler").count() >= 3,
        "{log}"
    );
}

#[tokio::test]
async fn a_permanent_exit_ends_supervision_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = watch::channel(States::new());
    let tuning = SupervisorTuning {
        permanent_exit: Some(78),
        ..fast()
    };
    let task = supervise(
        sh("exit 78", dir.path().join("log")),
        CancellationToken::new(),
        tx,
        tuning,
    );
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("supervision ends by itself");
    let state = rx.borrow()[&Component::KubeScheduler].clone();
    assert_eq!(state.restarts, 0);
    assert_eq!(state.pid, None);
    assert_eq!(
        state.last_exit.as_deref(),
        Some("exit status 78 (permanent: not restarted)")
    );
}

#[tokio::test]
async fn cancel_stops_child_and_escalates_to_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = watch::channel(States::new());
    let cancel = CancellationToken::new();
    // Ignores SIGTERM, so only SIGKILL after the grace period ends it.
    let spec = sh(
        "trap '' TERM; while true; do sleep 0.1; done",
        dir.path().join("log"),
    );
    let task = tokio::spawn(supervise(spec, cancel.clone(), tx, fast()));
    wait_for(&mut rx, "a pid", |s| s.pid.is_some()).await;
    let pid = rx.borrow()[&Component::KubeScheduler].pid.unwrap();
    assert!(pid_alive(pid));
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    assert!(!pid_alive(pid), "pid {pid} survived stop");
    assert_eq!(rx.borrow()[&Component::KubeScheduler].pid, None);
}

/// The niceness in `/proc/<pid>/stat` (the 19th field).
fn nice_of(pid: u32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(16).unwrap().parse().unwrap()
}

/// Control planes and containerd (whose pods inherit it) run at a lower CPU
/// priority than the process that starts them; ringd and the node's agents
/// keep it.
#[tokio::test]
async fn workloads_yield_the_cpu_and_ringd_and_the_kubelet_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let own = nice_of(std::process::id());
    let cases = [
        (Component::Etcd, (own + WORKLOAD_NICE).min(19)),
        (Component::KubeApiserver, (own + WORKLOAD_NICE).min(19)),
        (Component::Containerd, (own + WORKLOAD_NICE).min(19)),
        (Component::Ringd, own),
        (Component::Kubelet, own),
    ];
    for (component, want) in cases {
        let spec = ComponentSpec {
            component,
            program: "/bin/sleep".into(),
            args: vec!["30".into()],
            log: dir.path().join(format!("{component}.log")),
            netns: None,
        };
        let mut child = spawn(&spec).unwrap();
        let got = nice_of(child.id().unwrap());
        child.kill().await.unwrap();
        assert_eq!(got, want, "{component}");
    }
}
