//! A hot standby at the etcd level: a second voting member joined as a
//! learner and promoted to a voter, the host killed (SIGKILL) the moment it
//! acknowledged a write, the standby promoted alone; every write the host
//! acknowledged must be in the promoted data.

use std::process::{Child, Command, Stdio};

use backup::standby;
use seed::pki::{Leaf, Pki};

use super::*;

/// An etcd member process, killed on drop.
struct MemberProc(Option<Child>);

impl MemberProc {
    fn spawn(args: Vec<String>, tls: &[String], log: &Path) -> Self {
        let log = std::fs::File::create(log).expect("etcd log");
        let child = Command::new(etcd_bin())
            .args(args)
            .args(tls)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
        MemberProc(Some(child))
    }

    fn signal(&mut self, signal: nix::sys::signal::Signal) {
        if let Some(c) = &self.0 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), signal);
        }
    }

    /// Waits (bounded) for the process to exit after a signal.
    async fn wait_exit(&mut self, what: &str) {
        let child = self.0.as_mut().expect("running");
        wait_for(what, WAIT, || {
            let exited = child.try_wait().ok().flatten().is_some();
            async move { exited.then_some(()) }
        })
        .await;
        self.0 = None;
    }
}

impl Drop for MemberProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_holds_every_write_the_killed_host_acknowledged() {
    let dir = tempfile::Builder::new()
        .prefix("ring-standby-")
        .tempdir()
        .expect("temp dir");
    let d = dir.path();
    let pki = Pki::new(d.join("pki"));
    pki.ensure(
        "standby-test",
        &seed::ShootEndpoint::on(std::net::Ipv4Addr::LOCALHOST),
    )
    .expect("PKI");
    let (ca, server, peer, client) = (
        pki.ca().cert,
        pki.leaf(Leaf::EtcdServer),
        pki.leaf(Leaf::EtcdPeer),
        pki.leaf(Leaf::EtcdClient),
    );
    let tls: Vec<String> = vec![
        format!("--cert-file={}", server.cert.display()),
        format!("--key-file={}", server.key.display()),
        "--client-cert-auth=true".into(),
        format!("--trusted-ca-file={}", ca.display()),
        format!("--peer-cert-file={}", peer.cert.display()),
        format!("--peer-key-file={}", peer.key.display()),
        "--peer-client-cert-auth=true".into(),
        format!("--peer-trusted-ca-file={}", ca.display()),
    ];
    let ports = backup::etcd::free_ports(5).expect("free ports");
    let url = |i: usize| format!("https://127.0.0.1:{}", ports[i]);
    let cfg = |u: String| backup::EtcdConfig {
        endpoints: vec![u],
        ca_file: Some(ca.clone()),
        cert_file: Some(client.cert.clone()),
        key_file: Some(client.key.clone()),
        server_name: None,
    };

    // the host, serving alone
    let host_data = d.join("host");
    let mut host = MemberProc::spawn(
        backup::etcd::single_member_args("host", &host_data, &url(0), &url(1)),
        &tls,
        &d.join("host.log"),
    );
    let host_cfg = cfg(url(0));
    let mut writer_client = wait_ok("the host etcd answers", WAIT, || {
        let c = host_cfg.clone();
        async move {
            let mut client = backup::etcd::connect(&c).await.map_err(|e| e.to_string())?;
            client.status().await.map_err(|e| e.to_string())?;
            Ok(client)
        }
    })
    .await;
    for i in 0..200 {
        put(&mut writer_client, &format!("before/{i}"), "x").await;
    }

    // the standby joins as a learner, then votes
    let standby_data = d.join("standby");
    let joined = standby::add_learner(&host_cfg, "standby", &url(3))
        .await
        .expect("adding the standby");
    let again = standby::add_learner(&host_cfg, "standby", &url(3))
        .await
        .expect("adding the standby again");
    assert!(
        joined.added && !again.added,
        "a second add reuses the member"
    );
    assert_eq!(
        (again.id, &again.initial_cluster),
        (joined.id, &joined.initial_cluster)
    );
    let mut standby_proc = MemberProc::spawn(
        standby::joining_args(
            "standby",
            &standby_data,
            &url(2),
            &url(3),
            &joined.initial_cluster,
        ),
        &tls,
        &d.join("standby.log"),
    );
    wait_ok("the standby caught up and votes", WAIT, || {
        let c = host_cfg.clone();
        async move {
            match standby::promote_learner(&c, joined.id).await {
                Ok(true) => Ok(()),
                Ok(false) => Err("still a learner".to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;

    // both members hash the history alike (HashKV is each member's own)
    let voted = revision(&mut writer_client).await;
    let host_hash = writer_client
        .hash_kv(voted)
        .await
        .expect("host HashKV")
        .hash();
    let standby_cfg = cfg(url(2));
    wait_ok("the standby's HashKV is the host's", WAIT, || {
        let c = standby_cfg.clone();
        async move {
            let mut client = backup::etcd::connect(&c).await.map_err(|e| e.to_string())?;
            let hash = client
                .hash_kv(voted)
                .await
                .map_err(|e| e.to_string())?
                .hash();
            match hash == host_hash {
                true => Ok(()),
                false => Err(format!("{hash:#x}, the host's {host_hash:#x}")),
            }
        }
    })
    .await;

    // writes, each acknowledged by the host; the host is killed the moment
    // it acknowledged the last one: the standby holds that write in its log
    // but hears that it is committed only with the host's next heartbeat
    let mut acked = Vec::new();
    for i in 0..300 {
        let key = format!("acked/{i:06}");
        put(&mut writer_client, &key, "v").await;
        acked.push(key);
    }
    host.signal(nix::sys::signal::Signal::SIGKILL);
    host.wait_exit("the killed host to exit").await;

    // promote: the standby stops, re-forms alone, serves every acknowledged write
    standby_proc.signal(nix::sys::signal::Signal::SIGTERM);
    standby_proc.wait_exit("the standby to stop").await;
    let promoted = standby::promote(
        &etcd_bin(),
        &standby_data,
        "standby",
        &url(4),
        &d.join("promote.log"),
    )
    .await
    .expect("promotion");
    eprintln!("{} acknowledged; promotion: {promoted:?}", acked.len());
    assert!(promoted.keys >= 200 + acked.len() as i64, "{promoted:?}");
    let mut serving = TempEtcd::start(&etcd_bin(), &standby_data, "standby", &d.join("serve.log"))
        .await
        .expect("the promoted member serves");
    let mut c = serving.client().await.expect("client");
    let members = c.member_list().await.expect("members");
    let peers: Vec<Vec<String>> = members
        .members()
        .iter()
        .map(|m| m.peer_urls().to_vec())
        .collect();
    assert_eq!(peers, vec![vec![url(4)]], "one member, at its new peer URL");
    let hash = c.hash_kv(voted).await.expect("promoted HashKV").hash();
    assert_eq!(hash, host_hash, "the promoted member's history at {voted}");
    let got = c
        .get(
            "acked/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("reading the writes");
    let present: std::collections::BTreeSet<String> = got
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect();
    let lost: Vec<&String> = acked.iter().filter(|k| !present.contains(*k)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost after promotion ({} entries committed by raising the log's commit): first {:?}",
        lost.len(),
        acked.len(),
        promoted.entries_committed,
        lost.first()
    );
    // a write after the promotion commits on the lone member
    put(&mut c, "after", "promotion").await;
    serving.stop().await;
}
