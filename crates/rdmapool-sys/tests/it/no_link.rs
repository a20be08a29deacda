//! Binaries that use this crate must not link libibverbs or librdmacm: the libraries are
//! opened at run time, so the binaries start on machines without rdma-core.
//!
//! Checks, with `ldd` (and `readelf`/`nm` where installed), this test's own executable (which
//! calls `verbs()`/`rdmacm()`) and the `probe` example that `cargo test` builds next to it.
//! `scripts/check-no-link.sh` does the same for release binaries.
#![warn(clippy::undocumented_unsafe_blocks)]

use std::path::{Path, PathBuf};
use std::process::Command;

const FORBIDDEN: [&str; 2] = ["libibverbs", "librdmacm"];

/// Output of `tool args... path`, or None if the tool is not installed.
fn run(tool: &str, args: &[&str], path: &Path) -> Option<String> {
    let out = Command::new(tool).args(args).arg(path).output().ok()?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Some(text)
}

fn assert_not_linked(bin: &Path) {
    let ldd = run("ldd", &[], bin).expect("ldd is part of libc-bin and must be installed");
    eprintln!("ldd {}:\n{ldd}", bin.display());
    for lib in FORBIDDEN {
        assert!(!ldd.contains(lib), "{} links {lib}:\n{ldd}", bin.display());
    }
    if let Some(dynamic) = run("readelf", &["-d", "--wide"], bin) {
        for lib in FORBIDDEN {
            assert!(
                !dynamic.contains(lib),
                "{} has a DT_NEEDED on {lib}",
                bin.display()
            );
        }
    }
    // No undefined reference to any verbs/rdma_cm function either (e.g. from a stray extern
    // declaration that got called): such a binary would fail to load without rdma-core.
    if let Some(undefined) = run("nm", &["-D", "--undefined-only"], bin) {
        for line in undefined.lines() {
            let sym = line.split_whitespace().last().unwrap_or("");
            assert!(
                !(sym.starts_with("ibv_") || sym.starts_with("rdma_")),
                "{} references {sym}",
                bin.display()
            );
        }
    }
}

#[test]
fn this_test_binary_does_not_link_rdma_core() {
    // Use the table so the code paths that load libraries are really in this binary.
    let loaded = rdmapool_sys::verbs().is_ok();
    eprintln!("verbs() loaded: {loaded}");
    assert_not_linked(&std::env::current_exe().unwrap());
}

#[test]
fn the_probe_example_does_not_link_rdma_core_and_runs() {
    // target/<profile>/deps/it-<hash> -> target/<profile>/examples/probe
    let exe = std::env::current_exe().unwrap();
    let probe: PathBuf = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile_dir| profile_dir.join("examples").join("probe"))
        .unwrap();
    if !probe.exists() {
        // `cargo test` builds examples; a filtered build (`--test it`) may not have.
        eprintln!("SKIPPED: {} not built", probe.display());
        return;
    }
    assert_not_linked(&probe);
    let out = Command::new(&probe).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("probe:\n{stdout}");
    assert!(out.status.success(), "probe failed: {out:?}");
    assert!(stdout.starts_with("verbs: "), "{stdout}");
}
