//! Unit tests of image building: determinism, the archive's structure, errors.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::*;
use crate::binaries::BinarySearch;

const TEST: ImageName = ImageName {
    name: "hello",
    tag: "t1",
};

fn ldd() -> PathBuf {
    BinarySearch::standard(None)
        .find("ldd")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A small image: a host file (`input`), bytes, a symlink, and a dynamic program.
fn spec(input: &Path) -> ImageSpec {
    let mut spec = ImageSpec::new(TEST, &["/usr/local/bin/true"]);
    spec.add_host_file("/etc/hello.txt", input).unwrap();
    spec.insert(
        "/usr/local/bin/hi",
        Content::Bytes {
            data: b"#!/bin/sh\necho hi\n".to_vec(),
            mode: 0o755,
        },
    )
    .unwrap();
    spec.insert("/bin/hello", Content::Symlink("../usr/local/bin/hi".into()))
        .unwrap();
    spec.add_program("/usr/local/bin/true", Path::new("/bin/true"), &ldd())
        .unwrap();
    spec
}

/// Every regular file of a tar: name → bytes; and the headers in order.
fn entries(tar_bytes: &[u8]) -> (BTreeMap<String, Vec<u8>>, Vec<tar::Header>) {
    let mut files = BTreeMap::new();
    let mut headers = Vec::new();
    let mut archive = tar::Archive::new(tar_bytes);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        headers.push(entry.header().clone());
        let name = entry.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        files.insert(name, data);
    }
    (files, headers)
}

fn sha(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

#[test]
fn same_inputs_give_the_same_bytes_and_digest() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("hello.txt");
    std::fs::write(&input, "hello\n").unwrap();
    let a = build(&tmp.path().join("a"), &spec(&input)).unwrap();
    // a different mtime of the input changes nothing
    std::fs::write(&input, "hello\n").unwrap();
    let b = build(&tmp.path().join("b"), &spec(&input)).unwrap();
    assert!(a.rebuilt && b.rebuilt);
    assert_eq!(a.digest, b.digest);
    assert_eq!(
        std::fs::read(&a.archive).unwrap(),
        std::fs::read(&b.archive).unwrap()
    );
    assert_eq!(a.reference, "docker.io/ring/hello:t1");
    assert_eq!(a.size, std::fs::metadata(&a.archive).unwrap().len());
}

#[test]
fn changed_input_changes_the_digest_and_unchanged_skips_the_build() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let input = tmp.path().join("hello.txt");
    std::fs::write(&input, "hello\n").unwrap();
    let first = build(&out, &spec(&input)).unwrap();
    let again = build(&out, &spec(&input)).unwrap();
    assert!(!again.rebuilt, "identical inputs must not rebuild");
    assert_eq!(again.digest, first.digest);
    std::fs::write(&input, "hello, world\n").unwrap();
    let changed = build(&out, &spec(&input)).unwrap();
    assert!(changed.rebuilt);
    assert_ne!(changed.digest, first.digest);
    assert_eq!(
        list(&out).unwrap(),
        vec![BuiltImage {
            rebuilt: false,
            ..changed.clone()
        }]
    );
    // a changed entrypoint is a changed input too
    let mut other = spec(&input);
    other.entrypoint = vec!["/bin/hello".into()];
    assert_ne!(build(&out, &other).unwrap().digest, changed.digest);
}

#[test]
fn archive_documents_parse_and_match_their_blobs() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("hello.txt");
    std::fs::write(&input, "hello\n").unwrap();
    let built = build(&tmp.path().join("out"), &spec(&input)).unwrap();
    let (files, headers) = entries(&std::fs::read(&built.archive).unwrap());
    let names: Vec<String> = headers
        .iter()
        .map(|h| h.path().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "entries in sorted order");
    assert_eq!(files["oci-layout"], br#"{"imageLayoutVersion":"1.0.0"}"#);
    let blob = |digest: &str| -> &Vec<u8> {
        let data = &files[&blob_path(digest)];
        assert_eq!(sha(data), digest, "blob content matches its name");
        data
    };

    let index: Index = serde_json::from_slice(&files["index.json"]).unwrap();
    assert_eq!(index.manifests.len(), 1);
    let entry = &index.manifests[0];
    assert_eq!(entry.digest, built.digest);
    assert_eq!(
        entry.annotations[ANNOTATION_IMAGE_NAME],
        "docker.io/ring/hello:t1"
    );
    assert_eq!(entry.annotations[ANNOTATION_REF_NAME], "t1");
    let manifest_bytes = blob(&entry.digest);
    assert_eq!(manifest_bytes.len() as u64, entry.size);

    let manifest: Manifest = serde_json::from_slice(manifest_bytes).unwrap();
    let config_bytes = blob(&manifest.config.digest);
    assert_eq!(config_bytes.len() as u64, manifest.config.size);
    let config: ImageConfig = serde_json::from_slice(config_bytes).unwrap();
    assert_eq!(config.created, CREATED);
    assert_eq!(config.config.entrypoint, vec!["/usr/local/bin/true"]);
    assert_eq!(config.config.env, vec![PATH_ENV]);
    let layer = blob(&manifest.layers[0].digest);
    assert_eq!(layer.len() as u64, manifest.layers[0].size);
    assert_eq!(
        config.rootfs.diff_ids,
        vec![manifest.layers[0].digest.clone()]
    );

    let docker: Vec<DockerManifest> = serde_json::from_slice(&files["manifest.json"]).unwrap();
    assert_eq!(docker[0].repo_tags, vec!["ring/hello:t1"]);
    assert_eq!(docker[0].config, blob_path(&manifest.config.digest));
    assert_eq!(
        docker[0].layers,
        vec![blob_path(&manifest.layers[0].digest)]
    );
    layer_is_deterministic_and_complete(layer, &input);
}

fn layer_is_deterministic_and_complete(layer: &[u8], input: &Path) {
    let (files, headers) = entries(layer);
    for h in &headers {
        assert_eq!(
            (h.mtime().unwrap(), h.uid().unwrap(), h.gid().unwrap()),
            (0, 0, 0)
        );
        assert_eq!(h.username().unwrap(), Some(""));
    }
    let mode = |name: &str| {
        let h = headers
            .iter()
            .find(|h| h.path().unwrap().to_string_lossy() == name);
        h.unwrap_or_else(|| panic!("{name} missing"))
            .mode()
            .unwrap()
    };
    assert_eq!(mode("tmp/"), 0o1777);
    assert_eq!(mode("usr/local/bin/hi"), 0o755);
    assert_eq!(files["etc/hello.txt"], std::fs::read(input).unwrap());
    assert!(String::from_utf8_lossy(&files["etc/passwd"]).starts_with("root:x:0:0:"));
    assert!(String::from_utf8_lossy(&files["etc/group"]).starts_with("root:x:0:"));
    assert!(
        files.keys().any(|k| k.contains("libc.so")),
        "ldd's libraries: {:?}",
        files.keys()
    );
    let link = headers
        .iter()
        .find(|h| h.path().unwrap().to_string_lossy() == "bin/hello")
        .unwrap();
    assert_eq!(
        link.link_name().unwrap().unwrap().to_string_lossy(),
        "../usr/local/bin/hi"
    );
}

#[test]
fn missing_gcc_or_ringd_is_named_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(ldd(), tmp.path().join("ldd")).unwrap();
    let inputs = ImageInputs {
        search: BinarySearch::only([tmp.path().to_path_buf()]),
        ringd: tmp.path().join("ringd"),
        agent: tmp.path().join("ring-agent"),
    };
    let msg = catalog(&inputs).unwrap_err().to_string();
    assert!(msg.starts_with("gcc not found"), "{msg}");
    assert!(msg.contains("scripts/setup"), "{msg}");
    let empty = ImageInputs {
        search: BinarySearch::only([]),
        ringd: tmp.path().join("ringd"),
        agent: tmp.path().join("ring-agent"),
    };
    let msg = build_all(&tmp.path().join("out"), &empty)
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("ldd not found") && msg.contains("scripts/setup"),
        "{msg}"
    );
    let no_ringd = ImageInputs::standard(None, tmp.path().join("ringd"));
    let msg = catalog::ringd(&no_ringd, &ldd(), Path::new("objcopy"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("cargo build -p ringd"), "{msg}");
}

#[test]
fn pause_compiles_deterministically_and_runs() {
    let inputs = ImageInputs::standard(None, PathBuf::from("/nonexistent/ringd"));
    let a = catalog::pause(&inputs).unwrap();
    let b = catalog::pause(&inputs).unwrap();
    assert_eq!(
        a, b,
        "gcc -static -Os of the same source gives the same binary"
    );
    let Some(Content::Bytes { data, .. }) = a.files.get("/usr/local/bin/pause") else {
        panic!("no pause binary in {:?}", a.files.keys());
    };
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("pause");
    std::fs::write(&exe, data).unwrap();
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = std::process::Command::new(&exe).arg("-v").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "pause (ring) 3.2\n");
    assert_eq!(a.entrypoint, vec!["/usr/local/bin/pause"]);
}

#[test]
fn the_table_names_every_image_once() {
    assert_eq!(
        reference("etcd").as_deref(),
        Some("docker.io/ring/etcd:v3.7.3")
    );
    assert_eq!(
        reference("pause").as_deref(),
        Some("docker.io/ring/pause:3.2")
    );
    assert_eq!(
        RINGD.short(),
        format!("ring/ringd:{}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(reference("nginx"), None);
    let mut names: Vec<&str> = ALL.iter().map(|i| i.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), ALL.len());
    assert_eq!(crate::node::SANDBOX_IMAGE, PAUSE.full());
}

/// Ring's binaries go into images stripped: no debug info, no symbol table,
/// and the program still runs.
#[test]
fn a_stripped_binary_loses_debug_info_and_still_runs() {
    use std::os::unix::fs::PermissionsExt;
    let search = BinarySearch::standard(None);
    let (gcc, objcopy) = (search.find("gcc").unwrap(), search.find("objcopy").unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("seven.c");
    std::fs::write(&source, "int main(void) { return 7; }\n").unwrap();
    let built = tmp.path().join("seven");
    let ok = std::process::Command::new(gcc)
        .args(["-g", "-o"])
        .arg(&built)
        .arg(&source)
        .status()
        .unwrap();
    assert!(ok.success());
    let before = std::fs::read(&built).unwrap();
    let after = host::stripped("test", &objcopy, &built).unwrap();
    let has = |bytes: &[u8], what: &[u8]| bytes.windows(what.len()).any(|w| w == what);
    assert!(has(&before, b".debug_info") && has(&before, b".symtab"));
    assert!(!has(&after, b".debug_info") && !has(&after, b".symtab"));
    assert!(after.len() < before.len());
    let out = tmp.path().join("seven-stripped");
    std::fs::write(&out, &after).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    let code = std::process::Command::new(&out).status().unwrap().code();
    assert_eq!(code, Some(7));
    let missing = host::stripped("test", &objcopy, &tmp.path().join("nope")).unwrap_err();
    assert!(missing.to_string().contains("--strip-all"), "{missing}");
}
