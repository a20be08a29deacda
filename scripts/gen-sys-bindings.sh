#!/usr/bin/env bash
# Regenerates crates/rdmapool-sys/src/bindings.rs (types, constants, layout checks) and
# crates/rdmapool-sys/src/decls.rs (the exported functions' C prototypes) from the installed
# rdma-core headers. The crate never runs bindgen at build time: the output is committed.
#
# Needs (Debian/Ubuntu):
#   apt-get install libibverbs-dev librdmacm-dev clang libclang-dev
#   cargo install bindgen-cli        # or Debian's `bindgen` package
#
# Usage: scripts/gen-sys-bindings.sh            (writes the two files)
#        scripts/gen-sys-bindings.sh --check    (regenerates into a temp dir and diffs; exit 1 if stale)
#
# The header comment of each generated file records the rdma-core and bindgen versions and
# the exact command line, so a diff after regeneration shows what changed upstream.
set -euo pipefail
cd "$(dirname "$0")/.."

crate=crates/rdmapool-sys
wrapper=$crate/wrapper.h
out_dir=$crate/src
check=0
if [[ ${1:-} == --check ]]; then
  check=1
  out_dir=$(mktemp -d)
  trap 'rm -rf "$out_dir"' EXIT
fi

command -v bindgen >/dev/null || { echo "bindgen not found: cargo install bindgen-cli" >&2; exit 1; }
for h in /usr/include/infiniband/verbs.h /usr/include/rdma/rdma_cma.h; do
  [[ -f $h ]] || { echo "$h not found: apt-get install libibverbs-dev librdmacm-dev" >&2; exit 1; }
done

bindgen_version=$(bindgen --version | awk '{print $2}')
clang_version=$(bindgen --version --verbose 2>/dev/null | sed -n 's/^Clang: //p' | head -n1)
rdma_core_version=$(dpkg-query -W -f='${Version}' libibverbs-dev 2>/dev/null || echo unknown)
rdmacm_version=$(dpkg-query -W -f='${Version}' librdmacm-dev 2>/dev/null || echo unknown)
target=$(rustc -vV | sed -n 's/^host: //p')

# ---- what is bound -------------------------------------------------------------------------
# Root types; bindgen adds every type they reach (e.g. verbs_context reaches flow/counter/DM
# types through its function-pointer fields), so the layout of everything reachable is checked.
types=(
  # devices and contexts
  ibv_device ibv_context ibv_context_ops verbs_context ibv_node_type ibv_transport_type
  # query device / port / gid
  ibv_device_attr ibv_device_attr_ex ibv_query_device_ex_input ibv_device_cap_flags
  ibv_atomic_cap ibv_odp_caps ibv_odp_transport_cap_bits ibv_odp_general_caps
  ibv_port_attr _compat_ibv_port_attr ibv_port_state ibv_port_cap_flags ibv_port_cap_flags2
  ibv_mtu ibv_gid ibv_gid_entry ibv_gid_type
  # PD, MR (access flags incl. IBV_ACCESS_ON_DEMAND), ODP prefetch advice
  ibv_pd ibv_mr ibv_access_flags ib_uverbs_access_flags ib_uverbs_advise_mr_advice
  ib_uverbs_advise_mr_flag ib_uverbs_query_port_flags
  # completion channels, CQs
  ibv_comp_channel ibv_cq
  # QPs: create / modify / query / destroy, with every attribute mask
  ibv_qp ibv_qp_type ibv_qp_cap ibv_qp_init_attr ibv_qp_attr ibv_qp_attr_mask ibv_qp_state
  ibv_mig_state ibv_ah_attr ibv_global_route ibv_rate ibv_ah
  # SRQs
  ibv_srq ibv_srq_init_attr ibv_srq_attr ibv_srq_attr_mask
  # work requests, SGEs, work completions
  ibv_send_wr ibv_recv_wr ibv_sge ibv_wr_opcode ibv_send_flags
  ibv_wc ibv_wc_status ibv_wc_opcode ibv_wc_flags
  # async events
  ibv_async_event ibv_event_type
  # rdma_cm: ids, event channels, events, connection parameters and private data
  rdma_cm_id rdma_event_channel rdma_cm_event rdma_cm_event_type rdma_port_space
  rdma_conn_param rdma_ud_param rdma_addrinfo rdma_route rdma_addr rdma_ib_addr
)
# Constants: anonymous enums and #defines (e.g. RDMA_MAX_RESP_RES, IBV_WC_IP_CSUM_OK_SHIFT,
# RDMA_OPTION_ID_*). Named enums come with their type above.
vars='(IBV|RDMA)_.*|IB_UVERBS_ACCESS_OPTIONAL_FIRST'
# Exported functions whose prototypes go to decls.rs: exactly the entries of the loader's
# tables (src/verbs.rs, src/rdmacm.rs; a test checks the two lists agree). bindgen sees the
# prototypes of the real exported symbols: in C, ibv_reg_mr, ibv_reg_mr_iova and
# ibv_query_port are shadowed by macros of the same name (around the static inlines
# __ibv_reg_mr, __ibv_reg_mr_iova and ___ibv_query_port), which bindgen does not expand.
functions=(
  # libibverbs
  ibv_get_device_list ibv_free_device_list ibv_get_device_name ibv_get_device_guid
  ibv_open_device ibv_close_device ibv_get_async_event ibv_ack_async_event
  ibv_query_device ibv_query_port ibv_query_gid ibv_query_pkey
  ibv_alloc_pd ibv_dealloc_pd
  ibv_reg_mr ibv_reg_mr_iova ibv_reg_mr_iova2 ibv_dereg_mr
  ibv_create_comp_channel ibv_destroy_comp_channel
  ibv_create_cq ibv_resize_cq ibv_destroy_cq ibv_get_cq_event ibv_ack_cq_events
  ibv_create_qp ibv_modify_qp ibv_query_qp ibv_destroy_qp
  ibv_create_srq ibv_modify_srq ibv_query_srq ibv_destroy_srq
  ibv_create_ah ibv_destroy_ah
  ibv_fork_init
  ibv_wc_status_str ibv_event_type_str ibv_port_state_str ibv_node_type_str
  # librdmacm
  rdma_create_event_channel rdma_destroy_event_channel
  rdma_create_id rdma_destroy_id rdma_create_ep rdma_destroy_ep
  rdma_bind_addr rdma_resolve_addr rdma_resolve_route
  rdma_create_qp rdma_destroy_qp rdma_init_qp_attr
  rdma_connect rdma_establish rdma_listen rdma_get_request rdma_accept rdma_reject
  rdma_disconnect rdma_get_cm_event rdma_ack_cm_event rdma_event_str
  rdma_set_option rdma_migrate_id rdma_getaddrinfo rdma_freeaddrinfo
  rdma_get_devices rdma_free_devices rdma_get_src_port rdma_get_dst_port
)
# System types that the bound structs embed (sockaddr*, in6_addr, timespec, pthread_mutex_t,
# pthread_cond_t) are generated too rather than taken from libc: self-contained, real unions,
# and layout-checked with everything else. (bindgen's --opaque-type drops glibc's pthread
# typedefs of anonymous unions altogether, so they are not made opaque.)

common=(
  --rust-target 1.82
  --rust-edition 2021
  --no-prepend-enum-name   # IBV_ACCESS_LOCAL_WRITE, not ibv_access_flags_IBV_ACCESS_LOCAL_WRITE
  --default-enum-style consts  # C enums as integer constants: a provider may return values a
                               # Rust enum could not hold, and flag enums are OR'ed together
  --no-doc-comments        # header comments are not Rust doc syntax (and become doctests)
  --sort-semantically
  --merge-extern-blocks
)

header() { # $1 = what the file holds, $2.. = the bindgen command line
  local what=$1; shift
  cat <<EOF
// @generated by scripts/gen-sys-bindings.sh -- DO NOT EDIT; rerun the script instead.
//
// $what
// rdma-core:  libibverbs-dev $rdma_core_version, librdmacm-dev $rdmacm_version
//             (headers: infiniband/verbs.h, rdma/rdma_cma.h via crates/rdmapool-sys/wrapper.h)
// bindgen:    $bindgen_version (bindgen-cli), $clang_version
// target:     $target (the layout checks below are for this ABI)
// command:    bindgen $*
EOF
}

types_re="^($(IFS='|'; echo "${types[*]}"))\$"
functions_re="^($(IFS='|'; echo "${functions[*]}"))\$"

# 1. types and constants, with bindgen's layout tests (compile-time size/align/offset asserts)
bindgen_types=(
  "$wrapper"
  "${common[@]}"
  --allowlist-type "$types_re"
  --allowlist-var "$vars"
  --blocklist-function '.*'
  --with-derive-default
)
body=$(bindgen "${bindgen_types[@]}")
{ header "Types, constants and layout checks for libibverbs and librdmacm." "${bindgen_types[@]}"; echo; echo "$body"; } > "$out_dir/bindings.rs"

# 2. function prototypes only; types come from bindings.rs. decls.rs is never called (nothing
#    links libibverbs): the loader uses it to type-check its function-pointer table.
bindgen_fns=(
  "$wrapper"
  "${common[@]}"
  --allowlist-function "$functions_re"
  --blocklist-type '.*'
  --no-layout-tests
  --raw-line 'use super::bindings::*;'
)
body=$(bindgen "${bindgen_fns[@]}")
{ header "Prototypes of the exported libibverbs/librdmacm functions (never linked; see lib.rs)." "${bindgen_fns[@]}"; echo; echo "$body"; } > "$out_dir/decls.rs"

rustfmt --edition 2021 "$out_dir/bindings.rs" "$out_dir/decls.rs"

if (( check )); then
  status=0
  for f in bindings.rs decls.rs; do
    diff -u "$crate/src/$f" "$out_dir/$f" || status=1
  done
  (( status == 0 )) && echo "bindings are up to date"
  exit $status
fi
echo "wrote $out_dir/bindings.rs and $out_dir/decls.rs (rdma-core $rdma_core_version, bindgen $bindgen_version)"
