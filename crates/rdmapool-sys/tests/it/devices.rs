//! Device enumeration through the loaded libraries on whatever this machine has: without RDMA
//! hardware or kernel modules the calls must fail cleanly (NULL plus errno) or return an empty
//! list, never crash. With devices (a NIC, or rxe/siw set up) the lists must be well formed.
#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_int, CStr};
use std::io;
use std::ptr;

use rdmapool_sys::*;

fn loaded<T>(r: Result<T, LoadError>, what: &str) -> Option<T> {
    match r {
        Ok(t) => Some(t),
        Err(e) if e.is_library_missing() && std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("SKIPPED: {what} is not installed on this machine: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn ibv_get_device_list_is_empty_or_a_clean_error() {
    let Some(v) = loaded(verbs(), "libibverbs.so.1") else {
        return;
    };
    let mut num: c_int = -1;
    // SAFETY: `num` is a valid out-pointer.
    let list = unsafe { (v.ibv_get_device_list)(&mut num) };
    if list.is_null() {
        // rdma-core: ENOSYS when the kernel has no uverbs support, other errno values for
        // sysfs problems. Either way: no list, no crash.
        let err = io::Error::last_os_error();
        eprintln!("ibv_get_device_list: NULL ({err}); no RDMA devices here");
        assert!(
            err.raw_os_error().is_some_and(|e| e != 0),
            "NULL without errno"
        );
        return;
    }
    assert!(num >= 0);
    let mut names = Vec::new();
    for i in 0..num as usize {
        // SAFETY: the list holds `num` device pointers followed by NULL.
        let dev = unsafe { *list.add(i) };
        assert!(!dev.is_null());
        // SAFETY: `dev` is a device from the live list.
        let name = unsafe { CStr::from_ptr((v.ibv_get_device_name)(dev)) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: as above; index `num` is the terminator.
    let terminator = unsafe { *list.add(num as usize) };
    assert!(terminator.is_null(), "list not NULL-terminated");
    eprintln!("ibv_get_device_list: {num} device(s) {names:?}");
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { (v.ibv_free_device_list)(list) };
}

#[test]
fn rdma_cm_without_devices_fails_cleanly() {
    let Some(cm) = loaded(rdmacm(), "librdmacm.so.1") else {
        return;
    };
    let mut num: c_int = -1;
    // SAFETY: `num` is a valid out-pointer.
    let list = unsafe { (cm.rdma_get_devices)(&mut num) };
    if list.is_null() {
        eprintln!("rdma_get_devices: NULL ({})", io::Error::last_os_error());
    } else {
        eprintln!("rdma_get_devices: {num} device(s)");
        // SAFETY: `list` came from rdma_get_devices and is freed once.
        unsafe { (cm.rdma_free_devices)(list) };
    }

    // SAFETY: no arguments; the result is checked before use.
    let channel = unsafe { (cm.rdma_create_event_channel)() };
    if channel.is_null() {
        // No /dev/infiniband/rdma_cm (no rdma_ucm module): a clean error.
        eprintln!(
            "rdma_create_event_channel: NULL ({})",
            io::Error::last_os_error()
        );
        return;
    }
    let mut id: *mut rdma_cm_id = ptr::null_mut();
    // SAFETY: a live channel and a valid out-pointer.
    let rc = unsafe { (cm.rdma_create_id)(channel, &mut id, ptr::null_mut(), RDMA_PS_TCP) };
    if rc == 0 {
        // SAFETY: `id` is the live id just created; the address accessors only compute
        // field addresses.
        unsafe {
            assert_eq!(
                rdma_get_local_addr(id) as usize - id as usize,
                std::mem::offset_of!(rdma_cm_id, route)
            );
            assert!(rdma_get_peer_addr(id) as usize > rdma_get_local_addr(id) as usize);
            assert_eq!((cm.rdma_destroy_id)(id), 0);
        }
    }
    // SAFETY: the live channel, destroyed once (no ids left on it).
    unsafe { (cm.rdma_destroy_event_channel)(channel) };
}
