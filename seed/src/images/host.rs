//! What image builds ask of the host: running a tool with a time limit, and
//! the shared libraries `ldd` says a binary loads.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::error::{Result, SeedError};

/// What a finished command printed.
pub(super) struct Ran {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` to completion (stdin closed), killing it after `timeout`; the
/// error names the program.
pub(super) fn run(cmd: &mut Command, timeout: Duration) -> std::io::Result<Ran> {
    let out = crate::process::run_bounded(cmd, timeout)?;
    Ok(Ran {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// [`run`] for building `image`: failures to run are build errors of the image.
pub(super) fn run_for(image: &str, cmd: &mut Command, timeout: Duration) -> Result<Ran> {
    run(cmd, timeout).map_err(|e| SeedError::ImageBuild {
        image: image.to_string(),
        reason: format!("cannot run {e}"),
    })
}

/// `binary`'s bytes without debug info and symbol table (`objcopy
/// --strip-all` into a scratch file): Ring's own binaries are debug builds,
/// more than half of them both, and every node imports them.
pub(super) fn stripped(image: &str, objcopy: &Path, binary: &Path) -> Result<Vec<u8>> {
    let dir = scratch_dir("ring-stripped-")?;
    let out = dir.path().join("stripped");
    let mut cmd = Command::new(objcopy);
    cmd.arg("--strip-all").arg(binary).arg(&out);
    let ran = run_for(image, &mut cmd, Duration::from_secs(120))?;
    if !ran.success {
        return Err(SeedError::ImageBuild {
            image: image.to_string(),
            reason: format!(
                "`{} --strip-all {}` failed (objcopy is binutils', which gcc brings; run scripts/setup): {}",
                objcopy.display(),
                binary.display(),
                ran.stderr.trim()
            ),
        });
    }
    std::fs::read(&out).map_err(SeedError::io(&out))
}

/// A fresh directory under the temp dir, removed when dropped.
pub(super) fn scratch_dir(prefix: &str) -> Result<tempfile::TempDir> {
    let tmp = std::env::temp_dir();
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(SeedError::io(&tmp))
}

/// The shared libraries (and the dynamic loader) the `binaries` load, as
/// absolute paths in `ldd`'s order without repeats; empty for static binaries.
pub(super) fn shared_libraries(
    image: &str,
    ldd: &Path,
    binaries: &[PathBuf],
) -> Result<Vec<PathBuf>> {
    if binaries.is_empty() {
        return Ok(Vec::new());
    }
    let ran = run_for(
        image,
        Command::new(ldd).args(binaries),
        Duration::from_secs(60),
    )?;
    let text = format!("{}{}", ran.stdout, ran.stderr);
    let is_static =
        |t: &str| t.contains("not a dynamic executable") || t.contains("statically linked");
    if !ran.success && !is_static(&text) {
        let names: Vec<String> = binaries.iter().map(|b| b.display().to_string()).collect();
        return Err(SeedError::ImageBuild {
            image: image.to_string(),
            reason: format!("`ldd {}` failed: {}", names.join(" "), text.trim()),
        });
    }
    parse_ldd(&ran.stdout).map_err(|reason| SeedError::ImageBuild {
        image: image.to_string(),
        reason: match binaries {
            [one] => format!("{} {reason}", one.display()),
            _ => format!("a binary {reason}"),
        },
    })
}

/// The absolute library paths of `ldd` output; an error for a library not found.
pub(super) fn parse_ldd(text: &str) -> std::result::Result<Vec<PathBuf>, String> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim) {
        // Headers ("/path/to/binary:") when several binaries are listed; static ones.
        if line.is_empty()
            || line.ends_with(':')
            || line.contains("dynamic executable")
            || line.contains("statically linked")
        {
            continue;
        }
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)",
        // "linux-vdso.so.1 (0x...)" (in the kernel, nothing to copy), "libx.so => not found".
        let target = match line.split_once("=>") {
            Some((lib, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    return Err(format!(
                        "needs {}, which ldd cannot find; install the package that has it",
                        lib.trim()
                    ));
                }
                rest
            }
            None => line,
        };
        let path = target.split_whitespace().next().unwrap_or_default();
        if path.starts_with('/') && !libs.iter().any(|l: &PathBuf| l == Path::new(path)) {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_libraries_and_loader_but_not_vdso() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
        let several = "/a:\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n/b:\n\tnot a dynamic executable\n";
        assert_eq!(
            parse_ldd(several).unwrap(),
            vec![PathBuf::from("/lib/libc.so.6")]
        );
        let err = parse_ldd("\tlibgone.so.1 => not found\n").unwrap_err();
        assert!(err.contains("libgone.so.1"), "{err}");
    }

    #[test]
    fn a_real_dynamic_binary_lists_libc() {
        let ldd = crate::BinarySearch::standard(None)
            .find("ldd")
            .unwrap_or_else(|e| panic!("{e}"));
        let libs = shared_libraries("test", &ldd, &[PathBuf::from("/bin/sh")]).unwrap();
        assert!(
            libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
            "{libs:?}"
        );
    }
}
