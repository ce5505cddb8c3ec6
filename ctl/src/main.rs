//! `ringctl`: the command line of Ring, on top of every library crate (and the
//! only crate that uses both `bootstrap` and `scenarios`). The flags are in
//! `cli.rs`; each group of subcommands runs in its module under `commands/`.

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command, DescribeCommand, DrillCommand, PkiCommand};

mod backup;
mod bench;
mod cli;
mod commands;
mod controlplane;
mod docs;
mod images;
mod manifests;
mod output;
mod progress;

/// Runs one command.
async fn run(cli: Cli) -> anyhow::Result<()> {
    use commands::ring;
    let format = cli.output;
    match cli.command {
        Command::Controlplane(cmd) => commands::controlplane::run(cmd, format).await,
        Command::Bench(cmd) => commands::bench::run(cmd, format).await,
        Command::Backup(cmd) => commands::backup(cmd, format).await,
        Command::Drill(DrillCommand::Run(args)) => commands::drill_run(args, format).await,
        Command::Drill(DrillCommand::Summary(args)) => commands::drill_summary(args, format),
        Command::Drill(DrillCommand::KillMachine(args)) => commands::kill_machine(args).await,
        Command::Images(cmd) => commands::images(cmd, format).await,
        Command::Manifests(args) => commands::manifests(args).await,
        Command::Bootstrap(args) => ring::bootstrap(args, format).await,
        Command::Down(args) => ring::down(args, format).await,
        Command::Status(args) => ring::status(args, format).await,
        Command::Describe(DescribeCommand::Operation(args)) => {
            ring::describe_operation(args, format).await
        }
        Command::Pki(PkiCommand::Init(args)) => ring::pki_init(args).await,
        Command::Pki(PkiCommand::Check(args)) => commands::certs::pki_check(args, format).await,
        Command::Pki(PkiCommand::Renew(args)) => commands::certs::pki_renew(args, format).await,
        Command::Pki(PkiCommand::RotateCa(args)) => {
            commands::certs::pki_rotate_ca(args, format).await
        }
        Command::Join(args) => ring::join(args, format).await,
        Command::Leave(args) => ring::leave(args, format).await,
        Command::Migrate(args) => ring::migrate(args, format).await,
        Command::Restore(args) => ring::restore(args, format).await,
        Command::Version(args) => commands::version::version(args, format).await,
        Command::Docs(cmd) => docs::run(cmd),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Drills and benchmarks run throwaway rings (and drill networks) whose guards
    // tear them down when dropped: on SIGINT/SIGTERM, drop the command's future
    // (running those guards) instead of dying with the ring left running.
    let throwaway = matches!(cli.command, Command::Bench(_) | Command::Drill(_));
    let result = if throwaway {
        match commands::shutdown_on_signals() {
            Ok(interrupted) => {
                tokio::select! {
                    biased;
                    _ = interrupted.cancelled() => Err(anyhow::anyhow!(
                        "interrupted; the throwaway rings of this command were stopped and removed"
                    )),
                    r = run(cli) => r,
                }
            }
            Err(e) => Err(e),
        }
    } else {
        run(cli).await
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_message(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error with its causes; our error messages already embed their causes,
/// so only what is new is added.
fn error_message(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !msg.contains(&cause) {
            msg = format!("{msg}: {cause}");
        }
    }
    msg
}
