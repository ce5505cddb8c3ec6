//! `ringctl docs check`: the generated pages against what the code
//! generates, every internal link and anchor, and SUMMARY.md against the pages.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use anyhow::Context;

use super::links::{anchors, internal_links};

/// What to say after the problems of the generated pages.
const FIX: &str = "run `ringctl docs generate`";

/// Every problem of the book in `book` (`src/`, `src/reference/`, and the
/// README.md beside it, if any); empty when all is well.
pub(super) fn book(book: &Path, pages: &BTreeMap<String, String>) -> anyhow::Result<Vec<String>> {
    let src = book.join("src");
    let mut problems = drift(&src.join(super::REFERENCE), pages)?;
    let mut anchors = Anchors::default();
    for file in markdown_tree(&src)? {
        problems.extend(file_links(&file, Some(&src), &mut anchors)?);
    }
    let readme = book.parent().map(|p| p.join("README.md"));
    if let Some(readme) = readme.filter(|r| r.is_file()) {
        problems.extend(file_links(&readme, None, &mut anchors)?);
    }
    problems.extend(summary(&src)?);
    Ok(problems)
}

/// The generated pages in `dir` that differ from `pages`, are missing, or
/// are not generated at all.
pub(crate) fn drift(dir: &Path, pages: &BTreeMap<String, String>) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for (name, text) in pages {
        let path = dir.join(name);
        match std::fs::read(&path) {
            Ok(committed) if committed == text.as_bytes() => {}
            Ok(_) => problems.push(format!(
                "{}: stale: differs from what the code generates; {FIX}",
                path.display()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                problems.push(format!("{}: missing; {FIX}", path.display()))
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
    if dir.is_dir() {
        for name in markdown_files(dir)? {
            if !pages.contains_key(&name) {
                problems.push(format!(
                    "{}: extra: not a generated page (the folder holds only generated pages); {FIX}",
                    dir.join(name).display()
                ));
            }
        }
    }
    Ok(problems)
}

/// The names of the `.md` files directly in `dir` (none if it does not exist), sorted.
pub(super) fn markdown_files(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(names),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && entry.path().is_file() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Every `.md` file under `dir`, sorted.
fn markdown_tree(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))?;
        for entry in entries {
            let path = entry
                .with_context(|| format!("reading {}", d.display()))?
                .path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The anchors of each page read so far.
#[derive(Default)]
pub(crate) struct Anchors(BTreeMap<PathBuf, BTreeSet<String>>);

impl Anchors {
    fn of(&mut self, page: &Path) -> anyhow::Result<&BTreeSet<String>> {
        if !self.0.contains_key(page) {
            let text = std::fs::read_to_string(page)
                .with_context(|| format!("reading {}", page.display()))?;
            self.0.insert(page.to_path_buf(), anchors(&text));
        }
        Ok(&self.0[page])
    }
}

/// The broken internal links of `file`, each as `file:line: link → reason`.
/// A page of the book (`src` given) may link only within `src`: the book
/// publishes nothing else.
pub(crate) fn file_links(
    file: &Path,
    src: Option<&Path>,
    anchors: &mut Anchors,
) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut problems = Vec::new();
    for link in internal_links(&text) {
        if let Some(reason) = broken(file, src, &link.dest, anchors)? {
            problems.push(format!(
                "{}:{}: {} → {reason}",
                file.display(),
                link.line,
                link.dest
            ));
        }
    }
    Ok(problems)
}

/// Why link `dest` of `file` is broken, if it is.
fn broken(
    file: &Path,
    src: Option<&Path>,
    dest: &str,
    anchors: &mut Anchors,
) -> anyhow::Result<Option<String>> {
    let (path, anchor) = match dest.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (dest, None),
    };
    let path = path.split('?').next().unwrap_or("");
    let path = percent_decode(path);
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut target = if path.is_empty() {
        file.to_path_buf()
    } else if let Some(abs) = path.strip_prefix('/') {
        src.unwrap_or(dir).join(abs)
    } else {
        normalize(&dir.join(&path))
    };
    if let Some(src) = src {
        if !target.starts_with(normalize(src)) {
            return Ok(Some(format!(
                "outside {}: the book publishes only its own pages; link to the file in the repository instead",
                src.display()
            )));
        }
        if target.extension().is_some_and(|e| e == "html") {
            target.set_extension("md");
        }
    }
    if !target.exists() {
        return Ok(Some(format!("no such file {}", target.display())));
    }
    let Some(anchor) = anchor.filter(|a| !a.is_empty()) else {
        return Ok(None);
    };
    if target.extension().is_none_or(|e| e != "md") {
        return Ok(None);
    }
    let anchor = percent_decode(anchor);
    if anchors.of(&target)?.contains(&anchor) {
        return Ok(None);
    }
    Ok(Some(format!(
        "no heading with anchor #{anchor} in {}",
        target.display()
    )))
}

/// `%20` and friends decoded (links to files with spaces).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// `a/b/../c` as `a/c`, without asking the file system.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// SUMMARY.md against the pages: every page it lists exists, and every page
/// is listed (mdBook builds only those).
pub(crate) fn summary(src: &Path) -> anyhow::Result<Vec<String>> {
    let path = src.join("SUMMARY.md");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(vec![format!(
                "{}: missing: mdBook needs it",
                path.display()
            )])
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut problems = Vec::new();
    let mut listed = BTreeSet::new();
    for link in internal_links(&text) {
        let page = link.dest.split('#').next().unwrap_or("");
        let page = normalize(&src.join(percent_decode(page)));
        if !page.is_file() {
            problems.push(format!(
                "{}:{}: {} → lists a page that does not exist",
                path.display(),
                link.line,
                link.dest
            ));
        }
        listed.insert(page);
    }
    for page in markdown_tree(src)? {
        if page != path && !listed.contains(&normalize(&page)) {
            problems.push(format!(
                "{}: not in SUMMARY.md: mdBook does not build a page it does not list",
                page.display()
            ));
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    /// A link to a file with a space in its name resolves; a `%` that
    /// starts no escape stays as written.
    #[test]
    fn escapes_in_a_link_are_decoded_and_others_kept() {
        assert_eq!(super::percent_decode("my%20page.md"), "my page.md");
        assert_eq!(super::percent_decode("100%zz%2"), "100%zz%2");
    }
}
