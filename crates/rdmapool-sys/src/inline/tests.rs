//! The layout and behaviour tests of the ports (against the C definitions in bindings.rs).

use super::*;
use std::cell::Cell;

thread_local! {
    static COMPAT_CALLS: Cell<u32> = const { Cell::new(0) };
}

unsafe extern "C" fn fake_compat_query_port(
    _context: *mut ibv_context,
    port_num: u8,
    attr: *mut _compat_ibv_port_attr,
) -> c_int {
    COMPAT_CALLS.with(|c| c.set(c.get() + 1));
    // SAFETY: the port passes the caller's ibv_port_attr, cast as the header casts it.
    unsafe { (*attr.cast::<ibv_port_attr>()).lid = 0x1234 };
    c_int::from(port_num) + 100
}

unsafe extern "C" fn fake_query_port(
    _context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    assert_eq!(len, size_of::<ibv_port_attr>());
    // SAFETY: the test passes a pointer to a live ibv_port_attr.
    unsafe { (*attr).active_mtu = IBV_MTU_4096 };
    c_int::from(port_num) + 200
}

/// A heap verbs_context and a pointer to its embedded context that carries the whole
/// allocation's provenance (so reading `sz` and the ops before it is in bounds).
fn fake_vctx(extended: bool, sz: usize) -> (*mut verbs_context, *mut ibv_context) {
    let mut v = Box::<verbs_context>::default();
    v.sz = sz;
    v.context.abi_compat = if extended {
        VERBS_ABI_IS_EXTENDED
    } else {
        ptr::null_mut()
    };
    v.query_port = Some(fake_query_port);
    let vp = Box::into_raw(v);
    // SAFETY: `vp` is a live allocation; only a field address is computed.
    let ctx = unsafe { &raw mut (*vp).context };
    (vp, ctx)
}

fn free(vp: *mut verbs_context) {
    // SAFETY: `vp` came from Box::into_raw in fake_vctx and is freed once.
    drop(unsafe { Box::from_raw(vp) });
}

#[test]
fn query_port_uses_the_extended_op_when_sz_covers_it() {
    let (vp, ctx) = fake_vctx(true, size_of::<verbs_context>());
    let mut attr = ibv_port_attr::default();
    // SAFETY: ctx is a live fake context; attr is writable.
    let rc = unsafe { query_port_with(fake_compat_query_port, ctx, 1, &mut attr) };
    assert_eq!(rc, 201);
    assert_eq!(attr.active_mtu, IBV_MTU_4096);
    assert_eq!(COMPAT_CALLS.with(Cell::get), 0);
    free(vp);
}

#[test]
fn query_port_falls_back_to_the_compat_export() {
    // Not extended at all.
    let (vp, ctx) = fake_vctx(false, size_of::<verbs_context>());
    let mut attr = ibv_port_attr {
        active_mtu: IBV_MTU_1024,
        ..Default::default()
    };
    // SAFETY: as above.
    let rc = unsafe { query_port_with(fake_compat_query_port, ctx, 2, &mut attr) };
    assert_eq!(rc, 102);
    assert_eq!(attr.lid, 0x1234);
    assert_eq!(
        attr.active_mtu, 0,
        "the port memsets port_attr first, as C does"
    );
    free(vp);

    // Extended, but the provider's verbs_context predates the query_port field.
    let too_small = size_of::<verbs_context>() - offset_of!(verbs_context, query_port) - 1;
    let (vp, ctx) = fake_vctx(true, too_small);
    let mut attr = ibv_port_attr::default();
    // SAFETY: as above.
    let rc = unsafe { query_port_with(fake_compat_query_port, ctx, 3, &mut attr) };
    assert_eq!(rc, 103);
    assert_eq!(COMPAT_CALLS.with(Cell::get), 2);
    free(vp);
}

#[test]
fn verbs_get_ctx_is_container_of() {
    let (vp, ctx) = fake_vctx(true, size_of::<verbs_context>());
    // SAFETY: ctx is a live fake context.
    assert_eq!(unsafe { verbs_get_ctx(ctx) }, vp);
    free(vp);
    let (vp, ctx) = fake_vctx(false, size_of::<verbs_context>());
    // SAFETY: as above.
    assert!(unsafe { verbs_get_ctx(ctx) }.is_null());
    free(vp);
}

#[test]
fn inc_rkey_wraps_the_key_byte_only() {
    assert_eq!(ibv_inc_rkey(0x1234_5600), 0x1234_5601);
    assert_eq!(ibv_inc_rkey(0x1234_56ff), 0x1234_5600);
    assert_eq!(ibv_inc_rkey(0xffff_ffff), 0xffff_ff00);
}
