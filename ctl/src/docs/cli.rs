//! reference/cli.md: every subcommand and flag of `ringctl`, from its clap
//! definition.

use clap::{Arg, ArgAction, Command, CommandFactory};

use super::{cell, GENERATED};

/// The page.
pub(super) fn page() -> String {
    let mut root = crate::cli::Cli::command();
    // building fills in every subcommand's full name and usage
    root.build();
    let mut out = format!(
        "# Command line\n\n{GENERATED}\n\n\
         Every command takes the global option `-o`/`--output` (table or json) \
         besides its own; `--help` shows the same text.\n"
    );
    command(&mut out, &root, true);
    out
}

/// One command's section, then its subcommands', depth first.
fn command(out: &mut String, cmd: &Command, root: bool) {
    let name = cmd.get_bin_name().unwrap_or(cmd.get_name());
    out.push_str(&format!("\n## `{name}`\n\n"));
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        out.push_str(&format!("{}\n\n", about.to_string().trim()));
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.trim().trim_start_matches("Usage:").trim();
    out.push_str(&format!("```text\n{usage}\n```\n"));
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && (root || !a.is_global_set()))
        .filter(|a| !matches!(a.get_action(), ArgAction::Help | ArgAction::Version))
        .collect();
    if !args.is_empty() {
        out.push_str(
            "\n| Argument | Value | Default | Environment | Possible values | Meaning |\n\
             | --- | --- | --- | --- | --- | --- |\n",
        );
        for a in args {
            out.push_str(&arg_row(a));
        }
    }
    // clap's own `help` subcommand only repeats what this page shows
    let subs: Vec<&Command> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .collect();
    if !subs.is_empty() {
        out.push_str("\n| Subcommand | Meaning |\n| --- | --- |\n");
        for s in &subs {
            let full = s.get_bin_name().unwrap_or(s.get_name());
            let about = s.get_about().map(|a| a.to_string()).unwrap_or_default();
            out.push_str(&format!(
                "| [`{}`](#{}) | {} |\n",
                s.get_name(),
                heading_id(full),
                cell(&about)
            ));
        }
    }
    for s in subs {
        command(out, s, false);
    }
}

/// The anchor mdBook gives the heading of command `full`.
fn heading_id(full: &str) -> String {
    super::links::heading_id(full)
}

/// One argument's table row.
fn arg_row(a: &Arg) -> String {
    let takes_value = a.get_action().takes_values();
    let names = if a.is_positional() {
        format!("`{}`", value_name(a))
    } else {
        let mut n = Vec::new();
        if let Some(l) = a.get_long() {
            n.push(format!("`--{l}`"));
        }
        if let Some(s) = a.get_short() {
            n.push(format!("`-{s}`"));
        }
        n.join(", ")
    };
    let value = if takes_value && !a.is_positional() {
        format!("`{}`", value_name(a))
    } else {
        String::new()
    };
    let default = a
        .get_default_values()
        .iter()
        .map(|v| format!("`{}`", v.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(", ");
    let env = a
        .get_env()
        .map(|e| format!("`{}`", e.to_string_lossy()))
        .unwrap_or_default();
    let possible = if takes_value {
        a.get_possible_values()
            .iter()
            .filter(|p| !p.is_hide_set())
            .map(|p| format!("`{}`", p.get_name()))
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        String::new()
    };
    let mut help = a
        .get_long_help()
        .or(a.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    if a.is_required_set() {
        help = format!("Required. {help}");
    }
    if a.is_global_set() {
        help = format!("{help} (global: every subcommand takes it)");
    }
    if matches!(a.get_num_args(), Some(r) if r.max_values() > 1)
        || matches!(a.get_action(), ArgAction::Append)
    {
        help = format!("{help} (may be given more than once)");
    }
    format!(
        "| {names} | {value} | {default} | {env} | {possible} | {} |\n",
        cell(&help)
    )
}

/// `<NAME>`-style value name: the declared one, else the argument's id in
/// capitals (as clap's help shows it).
fn value_name(a: &Arg) -> String {
    match a.get_value_names() {
        Some(names) if !names.is_empty() => names
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" "),
        _ => a.get_id().as_str().to_uppercase(),
    }
}
