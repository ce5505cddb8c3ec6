//! `ringctl docs`: the reference pages generated from the code (the CLI, the
//! config kinds, the metrics, the status JSON) and the check CI runs on the
//! book: no generated page differs from what the code generates, and no
//! internal link or anchor is broken.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

mod check;
mod cli;
mod config;
mod links;
mod metrics;
mod schema;
mod status;

#[cfg(test)]
mod tests;

/// Where the generated pages live, relative to the book's `src`.
const REFERENCE: &str = "reference";

#[derive(Subcommand)]
pub(crate) enum DocsCommand {
    /// Write the reference pages (CLI, config kinds, metrics, status JSON)
    /// generated from the code.
    Generate(GenerateArgs),
    /// Fail when a generated reference page is stale, missing or extra, or
    /// when an internal link or anchor of the book or README.md is broken,
    /// or SUMMARY.md and the pages disagree.
    Check(CheckArgs),
}

#[derive(Args)]
pub(crate) struct GenerateArgs {
    /// The folder the pages go to [default: docs/src/reference of the
    /// repository the current directory is in].
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct CheckArgs {
    /// The book's folder (with book.toml and src/; its reference pages in
    /// src/reference, README.md beside it) [default: docs of the
    /// repository the current directory is in].
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
}

/// Runs a `ringctl docs` command.
pub(crate) fn run(cmd: DocsCommand) -> anyhow::Result<()> {
    match cmd {
        DocsCommand::Generate(args) => {
            let out = match args.out {
                Some(dir) => dir,
                None => repo_root()?.join("docs").join("src").join(REFERENCE),
            };
            let pages = generate()?;
            write(&out, &pages)?;
            println!("wrote {} pages to {}", pages.len(), out.display());
            Ok(())
        }
        DocsCommand::Check(args) => {
            let book = match args.dir {
                Some(dir) => dir,
                None => repo_root()?.join("docs"),
            };
            let problems = check::book(&relative(&book), &generate()?)?;
            if problems.is_empty() {
                println!("docs: the reference pages are current and every internal link resolves");
                return Ok(());
            }
            for p in &problems {
                eprintln!("{p}");
            }
            bail!("docs check: {} problems", problems.len())
        }
    }
}

/// Every generated page: its file name in the reference folder and its text.
pub(crate) fn generate() -> anyhow::Result<BTreeMap<String, String>> {
    let mut pages = BTreeMap::new();
    pages.insert("index.md".to_string(), index());
    pages.insert("cli.md".to_string(), cli::page());
    pages.insert("config.md".to_string(), config::page()?);
    pages.insert("metrics.md".to_string(), metrics::page()?);
    pages.insert("status-json.md".to_string(), status::page()?);
    Ok(pages)
}

/// The note every generated page starts with.
pub(crate) const GENERATED: &str =
    "Generated from the code by `ringctl docs generate`; do not edit by hand \
     (CI's `ringctl docs check` fails when this page differs from what the code generates).";

fn index() -> String {
    format!(
        "# Reference\n\n{GENERATED}\n\n\
         - [Command line](cli.md): every `ringctl` subcommand and flag, with its \
           default, environment variable and possible values.\n\
         - [Config files](config.md): the kinds `Ring`, `RingMember`, `RingNode`, \
           `Drill` and `Backup`; every field with its YAML name, type, default \
           and the rules its validation enforces.\n\
         - [Metrics](metrics.md): every Prometheus metric of ringd and of the \
           backup sidecar: name, type, labels and meaning.\n\
         - [Status JSON](status-json.md): what `ringctl status -o json` prints, \
           field by field, and its JSON Schema.\n"
    )
}

/// Writes `pages` into `dir`, removing generated-looking pages (`*.md`)
/// that are no longer generated.
fn write(dir: &Path, pages: &BTreeMap<String, String>) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for name in check::markdown_files(dir)? {
        if !pages.contains_key(&name) {
            let path = dir.join(&name);
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    for (name, text) in pages {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `path` relative to the current directory when inside it, so that
/// problems name files as a reader typed them.
fn relative(path: &Path) -> PathBuf {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| path.to_path_buf())
}

/// The repository the current directory is in: the nearest ancestor whose
/// Cargo.toml declares the workspace.
fn repo_root() -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    for dir in cwd.ancestors() {
        let manifest = dir.join("Cargo.toml");
        if std::fs::read_to_string(&manifest).is_ok_and(|t| t.contains("[workspace]")) {
            return Ok(dir.to_path_buf());
        }
    }
    bail!(
        "{} is not inside the Ring repository (no Cargo.toml with [workspace] above it): give the folder",
        cwd.display()
    )
}

/// `text` as one Markdown table cell: on one line, `|` escaped, rustdoc's
/// intra-doc links (`` [`Timing::default`] ``) as plain code, and `<` outside
/// code spans escaped (mdBook would take `<ring>` for an HTML tag).
pub(crate) fn cell(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let plain = strip_doc_links(&flat);
    let mut out = String::new();
    let mut in_code = false;
    for c in plain.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '|' => out.push_str("\\|"),
            '<' if !in_code => out.push_str("&lt;"),
            _ => out.push(c),
        }
    }
    out
}

/// Rustdoc's `` [`x`] `` and `` [`x`](path) `` as `` `x` ``: their targets are
/// Rust paths, not pages.
fn strip_doc_links(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("[`") {
        let Some(len) = rest[start + 2..].find("`]") else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push('`');
        out.push_str(&rest[start + 2..start + 2 + len]);
        out.push('`');
        rest = &rest[start + 2 + len + 2..];
        if let Some(after) = rest.strip_prefix('(') {
            if let Some(close) = after.find(')') {
                rest = &after[close + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}
