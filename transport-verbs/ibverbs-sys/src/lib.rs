//! Raw bindings to rdma-core's libibverbs, generated at build time with bindgen (libclang 14
//! or newer) from the system's `infiniband/verbs.h`.
//!
//! The verbs calls that rdma-core offers only as `static inline` functions or macros (posting,
//! polling, `ibv_query_port`, `ibv_reg_mr`, `ibv_query_gid_ex`, `ibv_get_device_list`) are
//! exposed as real functions named `ibvs_*`, compiled from `src/wrappers.c`. Call those, not
//! the `ibv_*` symbols of the same name (which are the old ABI or absent).
//!
//! Enums are plain constants without the enum's name (`IBV_ACCESS_LOCAL_WRITE`), each enum a
//! type alias of its integer type.
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case)]
#![allow(clippy::all)]
#![allow(rustdoc::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
