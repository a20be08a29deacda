//! Loading libibverbs/librdmacm at run time and resolving every symbol.
//!
//! Where the libraries are absent the tests that need them print why and pass, except under
//! CI (`CI=true`), where they must be installed (`libibverbs1`, `librdmacm1`) and their
//! absence fails the test.
#![warn(clippy::undocumented_unsafe_blocks)]

use std::collections::BTreeSet;
use std::ffi::CStr;

use rdmapool_sys::*;

/// Returns true if the test should go on; false (after printing why) to skip; panics under CI.
fn present(what: &str, result: &Result<impl Sized, LoadError>) -> bool {
    match result {
        Ok(_) => true,
        Err(e) if e.is_library_missing() => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("CI=true and {what} is not installed (apt-get install libibverbs1 librdmacm1 ibverbs-providers): {e}");
            }
            eprintln!("SKIPPED: {what} is not installed on this machine: {e}");
            false
        }
        Err(e) => panic!("{what} is installed but unusable: {e}"),
    }
}

#[test]
fn libibverbs_loads_and_every_symbol_resolves() {
    let loaded = verbs();
    if !present("libibverbs.so.1", &loaded) {
        return;
    }
    let v = loaded.unwrap();
    assert_eq!(v.library_name(), "libibverbs.so.1");
    for sym in Verbs::SYMBOLS {
        let pinned = v
            .resolved_address(sym.name)
            .expect("every listed symbol has a field");
        assert!(
            !pinned.is_null(),
            "{}@{} resolved to NULL",
            sym.name,
            sym.version
        );
        // The pinned version must be the library's default one (what C code built against
        // these headers links to); a mismatch means the headers and the library disagree and
        // the bindings need regenerating.
        assert_eq!(
            v.default_symbol_address(sym.name),
            Some(pinned),
            "{}@{} is not the default version of {} in the installed libibverbs",
            sym.name,
            sym.version,
            sym.name
        );
    }
    // Calling something harmless through the table works.
    // SAFETY: ibv_wc_status_str returns a static string for any status value.
    let s = unsafe { CStr::from_ptr((v.ibv_wc_status_str)(IBV_WC_RETRY_EXC_ERR)) };
    assert_eq!(s.to_str().unwrap(), "transport retry counter exceeded");
    // Same table on every call.
    assert!(std::ptr::eq(v, verbs().unwrap()));
}

#[test]
fn librdmacm_loads_and_every_symbol_resolves() {
    let loaded = rdmacm();
    if !present("librdmacm.so.1", &loaded) {
        return;
    }
    let cm = loaded.unwrap();
    for sym in Rdmacm::SYMBOLS {
        let pinned = cm
            .resolved_address(sym.name)
            .expect("every listed symbol has a field");
        assert!(
            !pinned.is_null(),
            "{}@{} resolved to NULL",
            sym.name,
            sym.version
        );
        assert_eq!(
            cm.default_symbol_address(sym.name),
            Some(pinned),
            "{}@{} is not the default version in the installed librdmacm",
            sym.name,
            sym.version
        );
    }
    // SAFETY: rdma_event_str returns a static string for any event value.
    let s = unsafe { CStr::from_ptr((cm.rdma_event_str)(RDMA_CM_EVENT_ESTABLISHED)) };
    assert_eq!(s.to_str().unwrap(), "RDMA_CM_EVENT_ESTABLISHED");
}

#[test]
fn a_missing_library_is_a_clear_error() {
    // SAFETY: the name does not exist, so nothing is loaded or run.
    let err = unsafe { Verbs::open("libibverbs-not-installed.so.1") }.unwrap_err();
    assert!(err.is_library_missing());
    let msg = err.to_string();
    assert!(
        msg.starts_with("libibverbs-not-installed.so.1 not found: install rdma-core's ibverbs-providers/libibverbs1 package"),
        "{msg}"
    );
    assert!(msg.contains("apt-get install libibverbs1"), "{msg}");

    // SAFETY: as above.
    let err = unsafe { Rdmacm::open("librdmacm-not-installed.so.1") }.unwrap_err();
    assert!(
        err.to_string()
            .contains("install rdma-core's librdmacm1 package"),
        "{err}"
    );
}

#[test]
fn a_library_without_the_symbols_is_a_clear_error() {
    // libc is always there and exports none of the verbs: the first missing symbol is named
    // with its version.
    // SAFETY: libc.so.6 is already loaded in this process; opening it again runs nothing.
    let err = unsafe { Verbs::open("libc.so.6") }.unwrap_err();
    assert!(!err.is_library_missing());
    let msg = err.to_string();
    assert!(
        msg.starts_with("libc.so.6 has no ibv_get_device_list@IBVERBS_1.1"),
        "{msg}"
    );
}

/// The names in `src/decls.rs` (bindgen's prototypes, allowlisted by the generator script)
/// and the loader tables must be the same set. Together with the compile-time signature check
/// (every table entry must coerce from its decl), this keeps the script and the tables in step.
#[test]
fn tables_cover_exactly_the_generated_prototypes() {
    let decls = include_str!("../../src/decls.rs");
    let generated: BTreeSet<&str> = decls
        .split("pub fn ")
        .skip(1)
        .map(|rest| rest.split('(').next().unwrap().trim())
        .collect();
    let tables: BTreeSet<&str> = Verbs::SYMBOLS
        .iter()
        .chain(Rdmacm::SYMBOLS)
        .map(|s| s.name)
        .collect();
    assert_eq!(generated, tables);
}
