//! One memory model: every handle is `RegisteredMemory`; caller-owned buffers register
//! safely (`Pd::register`, `Registrar::submit_owned`) and come back after deregistration.

use crate::support::*;
use rdmapool::buf::{BufferPool, PoolConfig};
use rdmapool::fabric::*;
use rdmapool::mr::{CacheConfig, HugeOptions, HugeRegion, RegCache, Registrar, RegistrarConfig};
use rdmapool::CoreError;
use std::sync::Arc;

/// The same generic code moves data through every kind of handle.
fn write_through<M: RegisteredMemory>(a: &Node, qa: &Qp, local: &M, target: &Mr, seed: u8) {
    let sge = local.sge(0, 64).unwrap();
    assert_eq!(sge.addr, local.addr());
    assert!(local.sge(local.len() - 8, 64).is_err(), "past the end");
    assert!(local.remote_at(local.len()).is_ok() && local.remote_at(local.len() + 1).is_err());
    target.write_at(0, &[0u8; 64]).unwrap();
    // SAFETY: the handles' memory is plain registered memory of this process.
    unsafe {
        std::ptr::copy_nonoverlapping(pattern(64, seed).as_ptr(), local.addr() as *mut u8, 64)
    };
    qa.post_send(&[write_wr(seed as u64, target.remote_at(0).unwrap(), &[sge])])
        .unwrap();
    assert!(one(&a.cq).is_ok());
    let mut got = vec![0u8; 64];
    target.read_at(0, &mut got).unwrap();
    assert!(got == pattern(64, seed), "handle {seed}");
}

#[test]
fn every_handle_is_registered_memory() {
    let (a, b) = (node_on(Transport::Auto), node_on(Transport::Auto));
    let (qa, _qb) = pair(&a, &b, &config());
    let target = b.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    let mr = a.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    write_through(&a, &qa, &mr, &target, 1);
    write_through(
        &a,
        &qa,
        &Arc::new(a.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap()),
        &target,
        2,
    );
    let owned =
        a.pd.register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
            .unwrap();
    write_through(&a, &qa, &owned, &target, 3);
    let pool = BufferPool::new(a.pd.clone(), PoolConfig::default()).unwrap();
    write_through(&a, &qa, &pool.alloc(1000).unwrap(), &target, 4);
    let registrar = Registrar::new(a.pd.clone(), RegistrarConfig::default()).unwrap();
    let mem = vec![0u8; 3 * 4096];
    // SAFETY: `mem` outlives the handles.
    let batch = unsafe {
        registrar
            .register_batch(
                &[(mem.as_ptr(), 4096), (mem[4096..].as_ptr(), 4096)],
                AccessFlags::LOCAL_WRITE,
            )
            .unwrap()
    };
    assert_eq!(batch[1].addr(), mem[4096..].as_ptr() as u64);
    write_through(&a, &qa, &batch[1], &target, 5);
    let cache = RegCache::new(a.pd.clone(), CacheConfig::default()).unwrap();
    let buf = vec![0u8; 8192];
    // SAFETY: `buf` outlives the handle.
    let cached = unsafe { cache.get(buf[100..].as_ptr(), 500).unwrap() };
    assert_eq!(
        (cached.addr(), cached.len()),
        (buf[100..].as_ptr() as u64, 500)
    );
    write_through(&a, &qa, &cached, &target, 6);
    let region = HugeRegion::alloc(4 << 20, HugeOptions::default()).unwrap();
    // SAFETY: `region` outlives `chunked`.
    let chunked = unsafe {
        registrar
            .register_chunked(region.as_ptr(), region.len(), 2 << 20, u64::MAX)
            .unwrap()
    };
    assert_eq!(chunked.iter().map(|m| m.len()).sum::<usize>(), 4 << 20);
    let at = |offset: usize| region.as_ptr().wrapping_add(offset);
    let second = rdmapool::mr::region_for(&chunked, at((2 << 20) + 8), 64).unwrap();
    assert_eq!(second.lkey(), chunked[1].lkey(), "the chunk's own key");
    assert_eq!(
        rdmapool::mr::region_for(&chunked, at(3 << 20), 0)
            .unwrap()
            .rkey(),
        chunked[1].rkey()
    );
    assert!(
        rdmapool::mr::region_for(&chunked, at((2 << 20) - 8), 64).is_err(),
        "straddles two registrations"
    );
    write_through(&a, &qa, second, &target, 7);
    drop(chunked);
}

#[test]
fn an_owned_vec_registers_safely_and_comes_back_with_what_peers_wrote() {
    let (a, b) = (node_on(Transport::Auto), node_on(Transport::Auto));
    let (_qa, qb) = pair(&a, &b, &config());
    let regions = a.ctx.live_regions();
    let reg =
        a.pd.register(vec![1u8; 8192], AccessFlags::all_remote())
            .unwrap();
    assert_eq!(a.ctx.live_regions(), regions + 1);
    let src = b.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    src.write_at(0, b"from the peer").unwrap();
    qb.post_send(&[write_wr(
        1,
        reg.remote_at(100).unwrap(),
        &[src.sge(0, 13).unwrap()],
    )])
    .unwrap();
    assert!(one(&b.cq).is_ok());
    let v = reg.into_inner();
    assert_eq!(a.ctx.live_regions(), regions, "into_inner deregisters");
    assert_eq!(&v[100..113], b"from the peer");
    assert_eq!((v[99], v[113], v.len()), (1, 1, 8192));
    // Boxed slices and huge-page regions register the same way.
    let boxed =
        a.pd.register(vec![0u8; 4096].into_boxed_slice(), AccessFlags::LOCAL_WRITE);
    assert_eq!(boxed.unwrap().into_inner().len(), 4096);
    let huge = HugeRegion::alloc(2 << 20, HugeOptions::default()).unwrap();
    let huge = a.pd.register(huge, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(huge.len(), 2 << 20);
    drop(huge);
    assert_eq!(a.ctx.live_regions(), regions);
}

#[test]
fn a_failed_registration_gives_the_buffer_back() {
    let a = node();
    let err =
        a.pd.register(Vec::new(), AccessFlags::LOCAL_WRITE)
            .unwrap_err();
    assert!(
        matches!(err.error, CoreError::OutOfLimits { value: 0, .. }),
        "{err}"
    );
    // REMOTE_WRITE without LOCAL_WRITE is invalid in verbs: refused, buffer returned intact.
    let err =
        a.pd.register(vec![9u8; 4096], AccessFlags::REMOTE_WRITE)
            .unwrap_err();
    assert_eq!(err.into_inner(), vec![9u8; 4096]);
}

#[test]
fn the_registrar_registers_owned_buffers_and_survives_early_drops() {
    let a = node();
    let registrar = Registrar::new(a.pd.clone(), RegistrarConfig::default()).unwrap();
    let reg = registrar
        .submit_owned(vec![3u8; 1 << 16], AccessFlags::LOCAL_WRITE)
        .wait()
        .unwrap();
    assert_eq!(reg.len(), 1 << 16);
    assert_eq!(reg.into_inner(), vec![3u8; 1 << 16]);
    // Dropped before, during or after the worker registers: nothing leaks, nothing is freed
    // under the worker.
    for i in 0..200 {
        let h = registrar.submit_owned(vec![i as u8; 4096 * (1 + i % 4)], AccessFlags::LOCAL_WRITE);
        if i % 3 == 0 {
            h.cancel();
        }
        drop(h);
    }
    let failed = registrar
        .submit_owned(vec![5u8; 64], AccessFlags::REMOTE_WRITE)
        .wait()
        .unwrap_err();
    assert_eq!(failed.into_inner(), vec![5u8; 64]);
    drop(registrar);
    assert_eq!(
        a.ctx.live_regions(),
        0,
        "every owned registration was undone"
    );
}

#[test]
fn views_of_every_origin_share_one_type_and_keep_their_region_alive() {
    let a = node_on(Transport::Auto);
    let base = a.ctx.live_regions();
    let region = Arc::new(a.pd.alloc_mr(8192, AccessFlags::all_remote()).unwrap());
    region.write_at(100, b"viewed").unwrap();
    let view: Mr<Shared> = Mr::share_range(&region, 100, 6).unwrap();
    assert_eq!((view.addr(), view.len()), (region.addr() + 100, 6));
    assert_eq!((view.lkey(), view.rkey()), (region.lkey(), region.rkey()));
    assert_eq!(
        view.owner().region().len(),
        8192,
        "the whole region it views"
    );
    assert!(Mr::share_range(&region, 8190, 4).is_err(), "past the end");
    assert!(
        view.write_at(4, b"xyz").is_err(),
        "a view is bounded by its own range"
    );
    let mut got = [0u8; 6];
    view.clone().read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"viewed");
    // The view keeps the registration after the last other handle drops.
    drop(region);
    assert_eq!(a.ctx.live_regions(), base + 1);
    view.write_at(0, b"VIEWED").unwrap();
    drop(view);
    assert_eq!(
        a.ctx.live_regions(),
        base,
        "deregistered with the last view"
    );

    // A pooled buffer as a view: its slot goes back when the view drops.
    let pool = BufferPool::new(a.pd.clone(), PoolConfig::default()).unwrap();
    let buf = pool.alloc(1000).unwrap();
    assert_eq!(buf.owner().class_len(), 1024);
    assert!(format!("{buf:?}").contains("Pooled"), "{buf:?}");
    let mixed: Vec<Mr<Shared>> = vec![
        buf.into_shared(),
        a.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .into_shared(),
    ];
    assert_eq!(pool.stats().in_use, 1);
    drop(mixed);
    assert_eq!(pool.stats().in_use, 0, "the slot went back");

    // A cached range: offsets are relative to the address asked for.
    let cache = RegCache::new(a.pd.clone(), CacheConfig::default()).unwrap();
    let mem = vec![0u8; 3 * 4096];
    // SAFETY: `mem` outlives the handles.
    let cached = unsafe { cache.get(mem[10..].as_ptr(), 100) }.unwrap();
    let whole = cached.owner().registration();
    assert!(whole.addr() <= cached.addr() && whole.len() >= 100);
    assert_eq!(cached.offset_of(mem[60..].as_ptr()).unwrap(), 50);
    assert!(
        cached.offset_of(mem[9..].as_ptr()).is_err(),
        "before the range"
    );
    assert!(
        cached.offset_of(mem[111..].as_ptr()).is_err(),
        "past its end"
    );
    let again = cached.clone();
    drop(cached);
    again.write_at(0, b"cached").unwrap();
    let mut seen = [0u8; 6];
    again.read_at(0, &mut seen).unwrap();
    assert_eq!(&seen, b"cached");
    assert_eq!(&mem[10..16], b"cached", "the bytes are the Vec's own");

    // A list of regions: the one holding a range, or a typed refusal.
    let none: Vec<Mr> = Vec::new();
    assert!(rdmapool::mr::region_for(&none, mem.as_ptr(), 1).is_err());
    let one = vec![a.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap()];
    let end = (one[0].addr() + 4096) as *const u8;
    assert!(
        rdmapool::mr::region_for(&one, end, 0).is_ok(),
        "the end is a valid address"
    );
    assert!(rdmapool::mr::region_for(&one, end, 1).is_err());
}
