/* Input for scripts/gen-sys-bindings.sh: the two rdma-core headers rdmapool-sys binds. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
