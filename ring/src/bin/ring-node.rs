//! `ring-node`: one Kubernetes node of a shoot (containerd, kubelet, kube-proxy in
//! the node's network namespace). Reads its config, runs until SIGTERM/Ctrl-C,
//! then stops the node and every pod on it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "ring-node",
    version,
    about = "A node of a shoot: containerd, kubelet and kube-proxy, supervised"
)]
struct Cli {
    /// The node's config file (kind: RingNode).
    #[arg(long)]
    config: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    ringd::init_tracing();
    let config = match seed::node::NodeConfig::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Before any thread exists: unshare(CLONE_NEWNS) refuses threaded processes.
    if let Err(e) = seed::node::isolate_mounts(&config) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = CancellationToken::new();
    let result = runtime.block_on(async {
        ringd::cancel_on_signals(shutdown.clone());
        seed::node::run(config, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
