//! Struct layouts as GCC 12 lays them out for x86_64-linux-gnu from the rdma-core 44 headers.
//!
//! bindgen's own layout checks (size, alignment and every field offset of every bound type,
//! computed by libclang) are compile-time assertions in `src/bindings.rs`: if one failed, this
//! crate would not build, so this test would not run. The numbers below come from a second
//! compiler (a C program printing `sizeof`/`_Alignof`/`offsetof`, run when the bindings were
//! generated) for the structs the verbs data path and the rdma_cm handshake touch, so a
//! clang/GCC disagreement or a hand edit of the generated file is caught too.
#![cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::mem::{align_of, offset_of, size_of};

use rdmapool_sys::*;

#[test]
fn layouts_match_gcc() {
    assert_eq!(size_of::<ibv_sge>(), 16);
    assert_eq!(align_of::<ibv_sge>(), 8);
    assert_eq!(size_of::<ibv_send_wr>(), 128);
    assert_eq!(align_of::<ibv_send_wr>(), 8);
    assert_eq!(offset_of!(ibv_send_wr, wr_id), 0);
    assert_eq!(offset_of!(ibv_send_wr, next), 8);
    assert_eq!(offset_of!(ibv_send_wr, sg_list), 16);
    assert_eq!(offset_of!(ibv_send_wr, num_sge), 24);
    assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
    assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
    assert_eq!(offset_of!(ibv_send_wr, wr), 40);
    assert_eq!(size_of::<ibv_recv_wr>(), 32);
    assert_eq!(align_of::<ibv_recv_wr>(), 8);
    assert_eq!(size_of::<ibv_wc>(), 48);
    assert_eq!(align_of::<ibv_wc>(), 8);
    assert_eq!(offset_of!(ibv_wc, status), 8);
    assert_eq!(offset_of!(ibv_wc, opcode), 12);
    assert_eq!(offset_of!(ibv_wc, vendor_err), 16);
    assert_eq!(offset_of!(ibv_wc, byte_len), 20);
    assert_eq!(offset_of!(ibv_wc, qp_num), 28);
    assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
    assert_eq!(offset_of!(ibv_wc, dlid_path_bits), 45);
    assert_eq!(size_of::<ibv_qp_attr>(), 144);
    assert_eq!(align_of::<ibv_qp_attr>(), 8);
    assert_eq!(offset_of!(ibv_qp_attr, qp_access_flags), 32);
    assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
    assert_eq!(offset_of!(ibv_qp_attr, alt_ah_attr), 88);
    assert_eq!(offset_of!(ibv_qp_attr, timeout), 130);
    assert_eq!(offset_of!(ibv_qp_attr, rate_limit), 136);
    assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
    assert_eq!(align_of::<ibv_qp_init_attr>(), 8);
    assert_eq!(size_of::<ibv_ah_attr>(), 32);
    assert_eq!(align_of::<ibv_ah_attr>(), 8);
    assert_eq!(size_of::<ibv_port_attr>(), 52);
    assert_eq!(align_of::<ibv_port_attr>(), 4);
    assert_eq!(offset_of!(ibv_port_attr, lid), 34);
    assert_eq!(offset_of!(ibv_port_attr, port_cap_flags2), 48);
    assert_eq!(size_of::<ibv_device_attr>(), 232);
    assert_eq!(align_of::<ibv_device_attr>(), 8);
    assert_eq!(size_of::<ibv_device_attr_ex>(), 400);
    assert_eq!(align_of::<ibv_device_attr_ex>(), 8);
    assert_eq!(offset_of!(ibv_device_attr_ex, odp_caps), 240);
    assert_eq!(size_of::<ibv_context_ops>(), 256);
    assert_eq!(align_of::<ibv_context_ops>(), 8);
    assert_eq!(offset_of!(ibv_context_ops, poll_cq), 88);
    assert_eq!(offset_of!(ibv_context_ops, req_notify_cq), 96);
    assert_eq!(offset_of!(ibv_context_ops, post_srq_recv), 160);
    assert_eq!(offset_of!(ibv_context_ops, post_send), 200);
    assert_eq!(offset_of!(ibv_context_ops, post_recv), 208);
    assert_eq!(size_of::<ibv_context>(), 328);
    assert_eq!(align_of::<ibv_context>(), 8);
    assert_eq!(offset_of!(ibv_context, ops), 8);
    assert_eq!(offset_of!(ibv_context, abi_compat), 320);
    assert_eq!(size_of::<verbs_context>(), 648);
    assert_eq!(align_of::<verbs_context>(), 8);
    assert_eq!(offset_of!(verbs_context, query_port), 0);
    assert_eq!(offset_of!(verbs_context, advise_mr), 8);
    assert_eq!(offset_of!(verbs_context, query_device_ex), 216);
    assert_eq!(offset_of!(verbs_context, sz), 312);
    assert_eq!(offset_of!(verbs_context, context), 320);
    assert_eq!(size_of::<ibv_qp>(), 160);
    assert_eq!(align_of::<ibv_qp>(), 8);
    assert_eq!(offset_of!(ibv_qp, context), 0);
    assert_eq!(offset_of!(ibv_qp, qp_num), 52);
    assert_eq!(offset_of!(ibv_qp, state), 56);
    assert_eq!(size_of::<ibv_cq>(), 128);
    assert_eq!(align_of::<ibv_cq>(), 8);
    assert_eq!(offset_of!(ibv_cq, context), 0);
    assert_eq!(size_of::<ibv_srq>(), 128);
    assert_eq!(align_of::<ibv_srq>(), 8);
    assert_eq!(offset_of!(ibv_srq, context), 0);
    assert_eq!(size_of::<ibv_mr>(), 48);
    assert_eq!(align_of::<ibv_mr>(), 8);
    assert_eq!(offset_of!(ibv_mr, lkey), 36);
    assert_eq!(offset_of!(ibv_mr, rkey), 40);
    assert_eq!(size_of::<ibv_pd>(), 16);
    assert_eq!(align_of::<ibv_pd>(), 8);
    assert_eq!(size_of::<ibv_async_event>(), 16);
    assert_eq!(align_of::<ibv_async_event>(), 8);
    assert_eq!(size_of::<ibv_gid>(), 16);
    assert_eq!(size_of::<rdma_cm_id>(), 416);
    assert_eq!(align_of::<rdma_cm_id>(), 8);
    assert_eq!(offset_of!(rdma_cm_id, route), 32);
    assert_eq!(offset_of!(rdma_cm_id, qp), 24);
    assert_eq!(offset_of!(rdma_cm_id, port_num), 348);
    assert_eq!(size_of::<rdma_route>(), 312);
    assert_eq!(align_of::<rdma_route>(), 8);
    assert_eq!(size_of::<rdma_addr>(), 296);
    assert_eq!(align_of::<rdma_addr>(), 8);
    assert_eq!(size_of::<rdma_conn_param>(), 24);
    assert_eq!(align_of::<rdma_conn_param>(), 8);
    assert_eq!(offset_of!(rdma_conn_param, private_data_len), 8);
    assert_eq!(offset_of!(rdma_conn_param, qp_num), 16);
    assert_eq!(size_of::<rdma_cm_event>(), 80);
    assert_eq!(align_of::<rdma_cm_event>(), 8);
    assert_eq!(offset_of!(rdma_cm_event, event), 16);
    assert_eq!(offset_of!(rdma_cm_event, status), 20);
    assert_eq!(offset_of!(rdma_cm_event, param), 24);
    assert_eq!(size_of::<rdma_ud_param>(), 56);
    assert_eq!(align_of::<rdma_ud_param>(), 8);
    assert_eq!(size_of::<rdma_addrinfo>(), 96);
    assert_eq!(align_of::<rdma_addrinfo>(), 8);
}
