//! `ring-agent`: runs inside a control plane's pods on a Kubernetes seed: the
//! lease guard around etcd and kube-apiserver, etcd's backup sidecar, and
//! etcd's restore init container (see `ringd::agent`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "ring-agent",
    version,
    about = "Ring's agent next to a control plane's pods: lease guard, backup, restore, stable endpoint"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs PROGRAM only while the lease ringd renews is valid.
    Guard {
        /// A local seed's lease file instead of the Lease in the pod's
        /// namespace; the guard then runs PROGRAM once and exits with it.
        #[arg(long)]
        lease_file: Option<PathBuf>,
        /// With --lease-file: start PROGRAM again when the lease is renewed
        /// after a fence (in a pod whose lease file comes from the node),
        /// instead of exiting with it.
        #[arg(long, requires = "lease_file")]
        restart: bool,
        /// Start PROGRAM only once HOST:PORT accepts a TCP connection
        /// (kube-apiserver waits for its etcd's Service).
        #[arg(long, value_name = "HOST:PORT")]
        wait_for: Option<String>,
        /// PROGRAM is etcd with this data dir: a member whose first start
        /// was cut short before it committed anything is moved aside before
        /// the next start (it could never elect itself).
        #[arg(long, value_name = "DIR")]
        etcd_data: Option<PathBuf>,
        /// The program and its arguments.
        #[arg(last = true, required = true)]
        program: Vec<String>,
    },
    /// Relays a shoot's stable addresses to where its control plane answers
    /// (run by ringd under the guard and the shoot's lease file).
    Forward {
        /// A stable address (`ADDR:PORT`) to listen on; repeated, paired in
        /// order with `--to`.
        #[arg(long, required = true)]
        listen: Vec<std::net::SocketAddr>,
        /// Where the connections to the `--listen` of the same place go
        /// (`HOST:PORT`).
        #[arg(long, required = true)]
        to: Vec<String>,
    },
    /// Backs up the pod's etcd into the ring's bucket while the lease is valid.
    Backup {
        /// The backup config (kind: Backup).
        #[arg(long)]
        backup_config: PathBuf,
        /// The shoot (its prefix in the bucket).
        #[arg(long)]
        shoot: String,
        /// Where deltas wait for the bucket.
        #[arg(long)]
        spool_dir: PathBuf,
        /// The lease file ringd writes on the node (`leaseFromNode`) instead
        /// of the Lease through the seed cluster's API, so backups go on
        /// while that API is away.
        #[arg(long)]
        lease_file: Option<PathBuf>,
    },
    /// Restores etcd's data from the bucket when the ConfigMap etcd-restore asks.
    Restore {
        /// The backup config (kind: Backup): bucket and key.
        #[arg(long)]
        backup_config: PathBuf,
        /// The shoot (its prefix in the bucket).
        #[arg(long)]
        shoot: String,
        /// etcd's data dir.
        #[arg(long)]
        data_dir: PathBuf,
        /// etcd's member name.
        #[arg(long)]
        member: String,
        /// etcd's peer URL.
        #[arg(long)]
        peer_url: String,
        /// etcd's initial cluster token.
        #[arg(long)]
        cluster_token: String,
    },
}

/// Where Kubernetes reads a failed container's message from.
const TERMINATION_LOG: &str = "/dev/termination-log";

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    ringd::init_tracing();
    let shutdown = CancellationToken::new();
    ringd::cancel_on_signals(shutdown.clone());
    let result = run(cli.command, shutdown).await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            // only where Kubernetes provides it (never create it on a host)
            if std::path::Path::new(TERMINATION_LOG).exists() {
                let _ = std::fs::write(TERMINATION_LOG, e.to_string());
            }
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, shutdown: CancellationToken) -> Result<(), ringd::RingError> {
    use ringd::agent::{guard, Cluster, LeaseSource};
    match command {
        // on a host: a local seed's guard, a Kubernetes seed's relay
        Command::Guard {
            lease_file: Some(file),
            restart,
            wait_for,
            etcd_data,
            program,
        } => {
            let source = LeaseSource::File(file);
            let mode = if restart {
                guard::Mode::Restart
            } else {
                guard::Mode::Once
            };
            let guarded = guard::Guarded {
                command: program,
                mode,
                wait_for,
                etcd_data,
            };
            guard::run(source, guarded, shutdown).await
        }
        Command::Forward { listen, to } => ringd::agent::forward::run(listen, to, shutdown).await,
        // in a control plane's pod
        Command::Guard {
            lease_file: None,
            wait_for,
            etcd_data,
            program,
            ..
        } => {
            let source = LeaseSource::Cluster(Cluster::from_pod().await?);
            let guarded = guard::Guarded {
                command: program,
                mode: guard::Mode::Restart,
                wait_for,
                etcd_data,
            };
            guard::run(source, guarded, shutdown).await
        }
        Command::Backup {
            backup_config,
            shoot,
            spool_dir,
            lease_file,
        } => {
            let config = ringd::agent::load_config(&backup_config, &shoot)?;
            let cluster = Cluster::from_pod().await?;
            let lease = match lease_file {
                Some(file) => LeaseSource::File(file),
                None => LeaseSource::Cluster(cluster.clone()),
            };
            ringd::agent::backup::run(cluster, lease, config, spool_dir, shutdown).await
        }
        Command::Restore {
            backup_config,
            shoot,
            data_dir,
            member,
            peer_url,
            cluster_token,
        } => {
            let args = ringd::agent::restore::RestoreArgs {
                config: ringd::agent::load_config(&backup_config, &shoot)?,
                data_dir,
                member: backup::etcd::Member {
                    name: member,
                    peer_url,
                    cluster_token,
                },
            };
            let cluster = Cluster::from_pod().await?;
            ringd::agent::restore::run(cluster, args, shutdown)
                .await
                .map(|_| ())
        }
    }
}
