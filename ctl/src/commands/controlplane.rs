//! `ringctl controlplane up|down|status|run`

use std::time::Duration;

use crate::cli::{ControlPlaneCommand, RunArgs, ShootArgs, StatusArgs, UpArgs};
use crate::controlplane::{self, UpOptions};
use crate::output::{status_table, Format};

use super::{init_tracing, print, ringctl_exe, shutdown_on_signals};

pub async fn run(cmd: ControlPlaneCommand, format: Format) -> anyhow::Result<()> {
    match cmd {
        ControlPlaneCommand::Up(args) => up(args, format).await,
        ControlPlaneCommand::Down(args) => down(args, format).await,
        ControlPlaneCommand::Status(args) => status(args, format).await,
        ControlPlaneCommand::Run(args) => supervise(args).await,
    }
}

async fn up(args: UpArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let opts = UpOptions {
        seed: args.target.seed.options(),
        shoot: args.target.shoot,
        api_address: args.api_address,
        timeout: Duration::from_secs(args.timeout),
    };
    let exe = ringctl_exe()?;
    let outcome = controlplane::up(&opts, &exe).await?;
    print(&outcome, format, || {
        let note = if outcome.started {
            format!("control plane of shoot {} is ready\n\n", opts.shoot)
        } else {
            format!(
                "control plane of shoot {} was already running\n\n",
                opts.shoot
            )
        };
        note + &status_table(std::slice::from_ref(&outcome.status))
    })
}

async fn down(args: ShootArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let status = controlplane::down(&args.seed.options(), &args.shoot).await?;
    print(&status, format, || {
        format!(
            "control plane of shoot {} stopped; its data is kept in place\n",
            status.shoot
        )
    })
}

async fn status(args: StatusArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let statuses = controlplane::status(&args.seed.options(), args.shoot.as_deref()).await?;
    print(&statuses, format, || {
        if statuses.is_empty() {
            "no control planes on this seed\n".into()
        } else {
            status_table(&statuses)
        }
    })
}

/// `ringctl controlplane run`: the supervisor, in the foreground until SIGTERM or Ctrl-C.
async fn supervise(args: RunArgs) -> anyhow::Result<()> {
    init_tracing("info");
    let shutdown = shutdown_on_signals()?;
    controlplane::run(
        &args.target.seed.options(),
        &args.target.shoot,
        args.api_address,
        shutdown,
    )
    .await?;
    Ok(())
}
