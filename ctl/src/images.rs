//! `ringctl images`: Ring's container images, built on this machine from local
//! binaries (no registry), listed, and imported into a containerd
//! (building and importing: `seed::images`).

use std::path::{Path, PathBuf};

use crate::output::{table, Format};
use anyhow::Context;
use clap::{Args, Subcommand};
use seed::images::{self, BuiltImage, ImageInputs};

#[derive(Subcommand)]
pub enum ImagesCommand {
    /// Build every image archive (pause, etcd, kube-apiserver, kube-controller-manager,
    /// kube-scheduler, kube-proxy, ringd) from this machine's binaries; unchanged ones are kept.
    Build(BuildArgs),
    /// The image archives in the images dir.
    List(DirArgs),
    /// Import every archive of the images dir into a containerd (namespace k8s.io, unpacked).
    Import(ImportArgs),
}

#[derive(Args)]
pub struct DirArgs {
    /// The images dir [default: $RING_CACHE/images, else ~/.cache/ring/images].
    #[arg(long)]
    out: Option<PathBuf>,
}

impl DirArgs {
    fn dir(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(images::default_dir)
    }
}

#[derive(Args)]
pub struct BuildArgs {
    #[command(flatten)]
    dir: DirArgs,
    /// The ringd binary to package [default: the ringd next to this ringctl].
    #[arg(long)]
    ringd: Option<PathBuf>,
    /// Directory searched first for etcd and the Kubernetes binaries.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct ImportArgs {
    /// containerd's socket.
    #[arg(long)]
    address: PathBuf,
    #[command(flatten)]
    dir: DirArgs,
    /// The ctr binary [default: the first on PATH].
    #[arg(long)]
    ctr: Option<PathBuf>,
}

/// Runs an `images` subcommand, printing its result in `format`.
pub async fn run(cmd: ImagesCommand, format: Format) -> anyhow::Result<()> {
    match cmd {
        ImagesCommand::Build(args) => {
            let ringd = match args.ringd {
                Some(path) => path,
                None => ringd_next_to_ringctl()?,
            };
            let inputs = ImageInputs::standard(args.bin_dir.as_deref(), ringd);
            let dir = args.dir.dir();
            let started = std::time::Instant::now();
            let (built, preload) = tokio::task::spawn_blocking(move || {
                let built = images::build_all(&dir, &inputs)?;
                // a node's first start links it instead of importing
                let preload = images::preload::build_standard(&dir)?;
                Ok::<_, seed::SeedError>((built, preload))
            })
            .await
            .context("the image build stopped")??;
            crate::commands::print(&built, format, || {
                let written = built.iter().filter(|b| b.rebuilt).count();
                let preload = preload.as_ref().map_or_else(
                    || "no containerd preload (not every control-plane image is built)".into(),
                    |p| format!("nodes start from the containerd root {}", p.display()),
                );
                format!(
                    "{}\n{written} written, {} up to date, in {:.1}s; {preload}\n",
                    render(&built),
                    built.len() - written,
                    started.elapsed().as_secs_f64()
                )
            })
        }
        ImagesCommand::List(args) => {
            let dir = args.dir();
            let built = images::list(&dir)?;
            crate::commands::print(&built, format, || {
                if built.is_empty() {
                    format!(
                        "no image archives in {}; build them with `ringctl images build`\n",
                        dir.display()
                    )
                } else {
                    render(&built)
                }
            })
        }
        ImagesCommand::Import(args) => import(args, format).await,
    }
}

/// `ringctl images import`: every archive into the containerd at `--address`.
async fn import(args: ImportArgs, format: Format) -> anyhow::Result<()> {
    let dir = args.dir.dir();
    let built = images::list(&dir)?;
    anyhow::ensure!(
        !built.is_empty(),
        "no image archives in {}; build them with `ringctl images build`",
        dir.display()
    );
    let ctr = match args.ctr {
        Some(ctr) => ctr,
        None => seed::BinarySearch::standard(None).find("ctr")?,
    };
    let socket = args.address;
    let imported = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<BuiltImage>> {
        for image in &built {
            eprintln!(
                "importing {} from {}",
                image.reference,
                image.archive.display()
            );
            images::import(&ctr, &socket, &image.archive)?;
        }
        let listed = images::listed(&ctr, &socket)?;
        for image in &built {
            let got = listed.get(&image.reference);
            anyhow::ensure!(
                got == Some(&image.digest),
                "after the import, containerd at {} has {} as {:?}, not {}",
                socket.display(),
                image.reference,
                got,
                image.digest
            );
        }
        Ok(built)
    })
    .await
    .context("the import stopped")??;
    crate::commands::print(&imported, format, || render(&imported))
}

/// The `ringd` in the directory of this executable.
fn ringd_next_to_ringctl() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating ringctl's own executable")?;
    let ringd = exe.parent().unwrap_or(Path::new(".")).join("ringd");
    anyhow::ensure!(
        ringd.is_file(),
        "{} not found (ringctl packages the ringd next to itself); build it with `cargo build -p ringd --bins` or pass --ringd",
        ringd.display()
    );
    Ok(ringd)
}

/// The images as a table: image, reference, digest, size, archive.
fn render(built: &[BuiltImage]) -> String {
    let mut t = table(&["IMAGE", "REF", "VERSIONS", "DIGEST", "SIZE", "ARCHIVE"]);
    for b in built {
        t.add_row(vec![
            b.name.clone(),
            b.reference.clone(),
            seed::images::versions_text(&b.versions),
            b.digest.clone(),
            format!("{:.1} MiB", b.size as f64 / (1024.0 * 1024.0)),
            b.archive.display().to_string(),
        ]);
    }
    t.to_string() + "\n"
}
