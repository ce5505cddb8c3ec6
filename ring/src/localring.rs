//! A ring of ringd processes on this machine: PKI, one config per member, and
//! spawning. Shared by `ringctl bench raft` and the end-to-end tests.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::config::{MemberConfig, RingdConfig, SeedConfig, Timing, TlsFiles, API_VERSION};
use crate::identity::RingPki;
use crate::RingError;

/// One member's files.
#[derive(Debug, Clone)]
pub struct LocalMember {
    pub name: String,
    pub id: u64,
    pub address: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
}

/// The files of a local ring under one directory.
#[derive(Debug, Clone)]
pub struct LocalRing {
    pub dir: PathBuf,
    pub pki: PathBuf,
    pub members: Vec<LocalMember>,
    pub timing: Timing,
}

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> Result<u16, RingError> {
    Ok(::backup::etcd::free_port()?)
}

/// `n` distinct free TCP ports on 127.0.0.1 ([`::backup::etcd::free_ports`]).
pub fn free_ports(n: usize) -> Result<Vec<u16>, RingError> {
    Ok(::backup::etcd::free_ports(n)?)
}

impl LocalRing {
    /// Writes the PKI (CA, member and admin certificates) and the configs of
    /// members m1..mn on free loopback ports; members named in `with_seed` host
    /// control planes on a local seed in their directory.
    pub fn write(
        dir: &Path,
        n: usize,
        with_seed: &[&str],
        timing: Timing,
    ) -> Result<Self, RingError> {
        let pki_dir = dir.join("pki");
        RingPki::new(&pki_dir).ensure_admin()?;
        let members: Vec<MemberConfig> = free_ports(n)?
            .into_iter()
            .enumerate()
            .map(|(i, port)| MemberConfig {
                name: format!("m{}", i + 1),
                id: i as u64 + 1,
                address: format!("127.0.0.1:{port}"),
            })
            .collect();
        let mut ring = LocalRing {
            dir: dir.to_path_buf(),
            pki: pki_dir,
            members: Vec::new(),
            timing,
        };
        for m in &members {
            ring.write_member(
                m.clone(),
                members.clone(),
                false,
                with_seed.contains(&m.name.as_str()),
            )?;
        }
        Ok(ring)
    }

    /// Writes the config of a new member that joins the ring (`join: true`) and
    /// returns its index; it starts once an existing member adds it.
    pub fn write_joiner(&mut self, name: &str, with_seed: bool) -> Result<usize, RingError> {
        let id = self.members.iter().map(|m| m.id).max().unwrap_or(0) + 1;
        let me = MemberConfig {
            name: name.to_string(),
            id,
            address: format!("127.0.0.1:{}", free_port()?),
        };
        let known: Vec<MemberConfig> = self
            .members
            .iter()
            .map(|m| MemberConfig {
                name: m.name.clone(),
                id: m.id,
                address: m.address.clone(),
            })
            .collect();
        self.write_member(me, known, true, with_seed)?;
        Ok(self.members.len() - 1)
    }

    fn write_member(
        &mut self,
        m: MemberConfig,
        members: Vec<MemberConfig>,
        join: bool,
        with_seed: bool,
    ) -> Result<(), RingError> {
        let pki = RingPki::new(&self.pki);
        let files = pki.ensure_member(&m.name, std::net::Ipv4Addr::LOCALHOST.into())?;
        let mdir = self.dir.join(&m.name);
        seed::pki::create_private_dir(&mdir)?;
        let config = RingdConfig {
            api_version: API_VERSION.into(),
            kind: "RingMember".into(),
            name: m.name.clone(),
            id: m.id,
            listen: m.address.clone(),
            metrics_listen: None,
            data_dir: mdir.join("data"),
            tls: TlsFiles {
                ca: files.ca,
                cert: files.cert,
                key: files.key,
            },
            members,
            join,
            timing: self.timing,
            seed: with_seed.then(|| SeedConfig {
                state_dir: mdir.join("seed"),
                bin_dir: None,
                kubernetes: None,
                release_grace_secs: crate::config::default_release_grace_secs(),
                certificate_check_secs: crate::config::default_certificate_check_secs(),
                api_advertise: Default::default(),
                deprecated_apis: Default::default(),
            }),
            backup: None,
            protection: Default::default(),
            initial_hosts: Default::default(),
        };
        config.validate()?;
        let path = mdir.join("ringd.yaml");
        let yaml = serde_yaml::to_string(&config).map_err(|e| RingError::Encode(e.to_string()))?;
        std::fs::write(&path, yaml).map_err(|source| RingError::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;
        self.members.push(LocalMember {
            name: m.name,
            id: m.id,
            address: m.address,
            log: mdir.join("ringd.log"),
            dir: mdir,
            config: path,
        });
        Ok(())
    }

    /// Starts `ringd --config` for member `i` in its own process group, logging to its log file.
    pub fn spawn(&self, ringd: &Path, i: usize) -> Result<Child, RingError> {
        self.spawn_with_env(ringd, i, &[])
    }

    /// [`LocalRing::spawn`] with extra environment variables for the member
    /// (tests run one member under `faketime` this way: its ringd and every
    /// process it starts see a skewed clock).
    pub fn spawn_with_env(
        &self,
        ringd: &Path,
        i: usize,
        env: &[(&str, &str)],
    ) -> Result<Child, RingError> {
        let m = &self.members[i];
        let io = |source| RingError::Io {
            what: format!("starting {} for {}", ringd.display(), m.name),
            source,
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .map_err(io)?;
        let err = log.try_clone().map_err(io)?;
        Command::new(ringd)
            .arg("--config")
            .arg(&m.config)
            .env(
                "RUST_LOG",
                "info,raft=warn,h2=warn,tower=warn,kube_client=off",
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(io)
    }
}
