use std::path::{Path, PathBuf};

use super::check::{drift, file_links, summary, Anchors};
use super::links::{anchors, heading_id, internal_links};

/// The committed reference pages.
fn reference_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference")
}

#[test]
fn heading_ids_follow_mdbooks_rule() {
    assert_eq!(heading_id("Getting started"), "getting-started");
    assert_eq!(heading_id("`ringctl backup start`"), "ringctl-backup-start");
    assert_eq!(heading_id("Timing (RingMember)"), "timing-ringmember");
    assert_eq!(
        heading_id("What \"lost\" means: A & B"),
        "what-lost-means-a--b"
    );
    assert_eq!(heading_id("snake_case and-dash"), "snake_case-and-dash");
}

#[test]
fn anchors_come_from_headings_code_ids_and_repeats() {
    let page = "# Top\n\n## The `ringd` daemon\n\n## Top\n\n## Custom {#here}\n\n<a id=\"raw\"></a>\n\n```md\n# Not a heading\n```\n";
    let a = anchors(page);
    for want in ["top", "the-ringd-daemon", "top-1", "here", "raw"] {
        assert!(a.contains(want), "{want} missing from {a:?}");
    }
    assert!(!a.contains("not-a-heading"), "{a:?}");
}

#[test]
fn links_in_code_are_not_links_and_external_ones_are_left_alone() {
    let page =
        "See [a](a.md#x).\n\n```md\n[in a block](missing.md)\n```\n\n`[inline](missing.md)`\n\n\
                [web](https://example.org) [mail](mailto:x@y.z) [ref][r]\n\n[r]: b.md\n";
    let links = internal_links(page);
    let dests: Vec<(usize, &str)> = links.iter().map(|l| (l.line, l.dest.as_str())).collect();
    assert_eq!(dests, vec![(1, "a.md#x"), (9, "b.md")]);
}

/// A book in a temp dir: `src/` with the given pages.
fn book(pages: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in pages {
        let path = dir.path().join("src").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

#[test]
fn broken_files_and_anchors_are_reported_with_their_line() {
    let dir = book(&[
        (
            "a.md",
            "# A\n\n[ok](b.md#section-one)\n[bad anchor](b.md#nowhere)\n[bad file](c.md)\n\
             [self](#a)\n\n```\n[ignored](c.md)\n```\n[out](../../README.md)\n",
        ),
        ("b.md", "# B\n\n## Section one\n"),
    ]);
    let src = dir.path().join("src");
    let problems = file_links(&src.join("a.md"), Some(&src), &mut Anchors::default()).unwrap();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(
        problems[0].contains("a.md:4: b.md#nowhere → no heading with anchor #nowhere"),
        "{}",
        problems[0]
    );
    assert!(
        problems[1].contains("a.md:5: c.md → no such file"),
        "{}",
        problems[1]
    );
    assert!(
        problems[2].contains("a.md:11: ../../README.md → outside"),
        "{}",
        problems[2]
    );
}

#[test]
fn summary_must_list_every_page_and_only_existing_ones() {
    let dir = book(&[
        (
            "SUMMARY.md",
            "# Summary\n\n- [A](a.md)\n- [Gone](gone.md)\n- [Draft]()\n",
        ),
        ("a.md", "# A\n"),
        ("unlisted.md", "# U\n"),
    ]);
    let problems = summary(&dir.path().join("src")).unwrap();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].contains("SUMMARY.md:4: gone.md → lists a page that does not exist"));
    assert!(problems[1].contains("unlisted.md: not in SUMMARY.md"));
}

/// The CI drift check: the committed pages are what the code generates.
#[test]
fn committed_reference_pages_are_current() {
    let problems = drift(&reference_dir(), &super::generate().unwrap()).unwrap();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_stale_page_fails_the_check_and_is_named() {
    let pages = super::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in &pages {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    assert!(drift(dir.path(), &pages).unwrap().is_empty());
    let stale = dir.path().join("metrics.md");
    let mut text = std::fs::read_to_string(&stale).unwrap();
    text.push_str("an edit by hand\n");
    std::fs::write(&stale, text).unwrap();
    std::fs::remove_file(dir.path().join("cli.md")).unwrap();
    std::fs::write(dir.path().join("notes.md"), "# Notes\n").unwrap();
    let problems = drift(dir.path(), &pages).unwrap();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("cli.md: missing"), "{}", problems[0]);
    assert!(problems[1].contains("metrics.md: stale"), "{}", problems[1]);
    assert!(problems[2].contains("notes.md: extra"), "{}", problems[2]);
    assert!(problems
        .iter()
        .all(|p| p.contains("run `ringctl docs generate`")));
}

#[test]
fn generated_pages_link_only_to_their_own_anchors() {
    let pages = super::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in &pages {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let mut anchors = Anchors::default();
    for name in pages.keys() {
        let problems = file_links(&dir.path().join(name), Some(dir.path()), &mut anchors).unwrap();
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}

/// Without a sample, a family's labels are unknown to the page: every
/// labelled metric needs an example call in `metrics::*_exposition`.
#[test]
fn every_metric_family_has_an_example_sample() {
    for text in [
        super::metrics::ringd_exposition(),
        super::metrics::backup_exposition(),
    ] {
        let families = super::metrics::parse(&text);
        assert!(families.len() > 5, "{text}");
        for f in families {
            assert!(
                f.sampled,
                "{} has no sample: add an example to docs/metrics.rs",
                f.name
            );
            assert!(!f.help.is_empty(), "{} has no help", f.name);
        }
    }
}

#[test]
fn the_generated_pages_do_not_depend_on_the_run() {
    assert_eq!(super::generate().unwrap(), super::generate().unwrap());
}
