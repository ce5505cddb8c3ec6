//! `ringd`: one member of a Ring. Reads its config, then runs until SIGTERM/Ctrl-C.
//! With `--supervise` it runs that ringd as its child and restarts it whenever
//! it exits (`ringd::supervisor`); `ringctl bootstrap` starts members so.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ringd::supervisor::exit_code;
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
    /// Run ringd as a child of this process and start it again (with
    /// backoff) whenever it exits, until SIGTERM; a ringd that exits saying
    /// no restart can help (code 78) is not started again.
    #[arg(long)]
    supervise: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    ringd::init_tracing();
    let shutdown = CancellationToken::new();
    ringd::cancel_on_signals(shutdown.clone());
    if cli.supervise {
        return report(ringd::supervisor::run(&cli.config, shutdown).await);
    }
    let config = match ringd::config::RingdConfig::load(&cli.config) {
        Ok(c) => c,
        Err(e) => return report(Err(e)),
    };
    let span = tracing::info_span!("ringd", member = %config.name);
    let _enter = span.enter();
    report(ringd::daemon::run(config, shutdown).await)
}

/// Success, or the error on stderr and an exit code saying whether a restart may help.
fn report(result: Result<(), ringd::RingError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(exit_code(&e))
        }
    }
}
