//! Probes for rdma-core at run time: prints the RDMA devices, or why there are none, and exits
//! 0 either way. Its binary must not link libibverbs or librdmacm (see `tests/no_link.rs` and
//! `scripts/check-no-link.sh`): it runs on machines without rdma-core.
//!
//! `cargo run -p rdmapool-sys --example probe`
#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_int, CStr};
use std::io;

fn main() {
    match rdmapool_sys::verbs() {
        Err(e) => println!("verbs: unavailable: {e}"),
        Ok(v) => {
            println!("verbs: loaded {}", v.library_name());
            let mut num: c_int = 0;
            // SAFETY: `num` is a valid out-pointer.
            let list = unsafe { (v.ibv_get_device_list)(&mut num) };
            if list.is_null() {
                println!("devices: none ({})", io::Error::last_os_error());
            } else {
                println!("devices: {num}");
                for i in 0..num.max(0) as usize {
                    // SAFETY: the list holds `num` valid device pointers.
                    let dev = unsafe { *list.add(i) };
                    // SAFETY: `dev` is a device of the live list; the name is a C string it
                    // owns.
                    let name = unsafe { CStr::from_ptr((v.ibv_get_device_name)(dev)) };
                    // SAFETY: as above.
                    let guid = u64::from_be(unsafe { (v.ibv_get_device_guid)(dev) });
                    println!("  {} guid {guid:016x}", name.to_string_lossy());
                }
                // SAFETY: `list` came from ibv_get_device_list and is freed once.
                unsafe { (v.ibv_free_device_list)(list) };
            }
        }
    }
    match rdmapool_sys::rdmacm() {
        Err(e) => println!("rdmacm: unavailable: {e}"),
        Ok(cm) => println!("rdmacm: loaded {}", cm.library_name()),
    }
}
