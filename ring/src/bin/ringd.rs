//! `ringd`: one member of a Ring. Reads its config, then runs until SIGTERM/Ctrl-C.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "ringd",
    version,
    about = "A member of a Ring: Raft quorum, failure detection, leases, hosted control planes"
)]
struct Cli {
    /// The member's config file (kind: RingMember).
    #[arg(long)]
    config: PathBuf,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    ringd::init_tracing();
    let config = match ringd::config::RingdConfig::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let span = tracing::info_span!("ringd", member = %config.name);
    let _enter = span.enter();
    let shutdown = CancellationToken::new();
    ringd::cancel_on_signals(shutdown.clone());
    match ringd::daemon::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
