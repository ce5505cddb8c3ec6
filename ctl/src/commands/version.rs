//! `ringctl version`: Ring's version, the component versions it is pinned to
//! (`deps/`), what the programs on this machine say of themselves, and, for a
//! local ring, what each shoot's kube-apiserver and each node report.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::cli::RingDirArgs;
use crate::output::Format;

use super::print;

/// How long one program or API may take to say its version.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// The programs Ring runs, and the arguments that make each print its version.
const PROGRAMS: [(&str, &[&str]); 12] = [
    ("kube-apiserver", &["--version"]),
    ("kube-controller-manager", &["--version"]),
    ("kube-scheduler", &["--version"]),
    ("kubelet", &["--version"]),
    ("kube-proxy", &["--version"]),
    ("kubectl", &["version", "--client"]),
    ("etcd", &["--version"]),
    ("etcdctl", &["version"]),
    ("etcdutl", &["version"]),
    ("containerd", &["--version"]),
    ("containerd-shim-runc-v2", &["-v"]),
    ("runc", &["--version"]),
];

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionView {
    pub ringctl: String,
    /// What `scripts/setup` builds (the pins in `deps/`).
    pub pinned: Pinned,
    pub programs: Vec<Program>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shoots: Vec<ShootVersion>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<bootstrap::nodes::NodeReport>,
}

#[derive(Debug, Serialize)]
pub struct Pinned {
    pub kubernetes: &'static str,
    pub etcd: &'static str,
    pub containerd: &'static str,
}

/// A program as found on this machine.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Program {
    pub name: &'static str,
    pub path: Option<PathBuf>,
    /// The first version-like word of what it printed.
    pub version: Option<String>,
    /// Why it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// What a shoot's kube-apiserver says of itself (`/version`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShootVersion {
    pub shoot: String,
    pub kubernetes: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

pub async fn version(args: RingDirArgs, format: Format) -> anyhow::Result<()> {
    let mut programs = Vec::new();
    let search = seed::BinarySearch::standard(None);
    for (name, version_args) in PROGRAMS {
        programs.push(program(&search, name, version_args).await);
    }
    let layout = bootstrap::RingLayout { dir: args.dir() };
    let ring = layout.read_config()?;
    let (shoots, nodes) = match &ring {
        Some(config) => (
            shoot_versions(&layout).await,
            bootstrap::nodes::report(&layout, config),
        ),
        None => (Vec::new(), Vec::new()),
    };
    let view = VersionView {
        ringctl: env!("CARGO_PKG_VERSION").into(),
        pinned: Pinned {
            kubernetes: seed::binaries::K8S_VERSION,
            etcd: seed::binaries::ETCD_VERSION,
            containerd: seed::binaries::CONTAINERD_VERSION,
        },
        programs,
        shoots,
        nodes,
    };
    print(&view, format, || render(&view))
}

async fn program(search: &seed::BinarySearch, name: &'static str, args: &[&str]) -> Program {
    let path = match search.find(name) {
        Ok(p) => p,
        Err(e) => {
            return Program {
                name,
                path: None,
                version: None,
                problem: Some(e.to_string()),
            }
        }
    };
    let (version, problem) = match seed::binaries::ask_version(&path, args, ASK_TIMEOUT).await {
        Ok(v) => (Some(v), None),
        Err(why) => (None, Some(why)),
    };
    Program {
        name,
        path: Some(path),
        version,
        problem,
    }
}

/// Each shoot's `/version`, asked with the ring dir's kubeconfigs.
async fn shoot_versions(layout: &bootstrap::RingLayout) -> Vec<ShootVersion> {
    let mut shoots: Vec<String> = std::fs::read_dir(layout.dir.join("kubeconfigs"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_suffix(".kubeconfig")
                        .map(String::from)
                })
                .collect()
        })
        .unwrap_or_default();
    shoots.sort();
    let mut out = Vec::new();
    for shoot in shoots {
        let asked = tokio::time::timeout(ASK_TIMEOUT, async {
            let client = seed::kubeconfig::client(&shoot, &layout.kubeconfig(&shoot)).await?;
            client
                .apiserver_version()
                .await
                .map_err(|e| seed::SeedError::Kube {
                    shoot: shoot.clone(),
                    message: e.to_string(),
                })
        })
        .await;
        let (kubernetes, problem) = match asked {
            Ok(Ok(info)) => (Some(info.git_version), None),
            Ok(Err(e)) => (None, Some(e.to_string())),
            Err(_) => (
                None,
                Some(format!("/version did not answer within {ASK_TIMEOUT:?}")),
            ),
        };
        out.push(ShootVersion {
            shoot,
            kubernetes,
            problem,
        });
    }
    out
}

fn render(v: &VersionView) -> String {
    let p = &v.pinned;
    let mut out = format!(
        "ringctl {}\npinned in deps/: Kubernetes {}, etcd {}, containerd {}\n\nprograms on this machine:\n",
        v.ringctl, p.kubernetes, p.etcd, p.containerd
    );
    for prog in &v.programs {
        let version = prog.version.as_deref().unwrap_or("-");
        let at = match (&prog.path, &prog.problem) {
            (_, Some(problem)) => problem.clone(),
            (Some(path), None) => path.display().to_string(),
            (None, None) => String::new(),
        };
        out += &format!("  {:<24} {:<10} {at}\n", prog.name, version);
    }
    out += &render_shoots(&v.shoots);
    if !v.nodes.is_empty() {
        out += &bootstrap::nodes::render_versions(&v.nodes);
    }
    out
}

/// The shoots' Kubernetes versions, as `ringctl version` shows them.
fn render_shoots(shoots: &[ShootVersion]) -> String {
    if shoots.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nshoots (kube-apiserver /version):\n");
    for s in shoots {
        let v = s.kubernetes.as_deref().unwrap_or("-");
        let problem = s.problem.as_deref().unwrap_or("");
        out += &format!("  {:<8} {v:<10} {problem}\n", s.shoot);
    }
    out
}
