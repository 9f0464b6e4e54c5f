//! The [`Transport`](transport_core::Transport) trait over UCX's UCP API.
//!
//! One [`Endpoint`] is one UCP context and one worker. Its address is the worker's address
//! (`ucp_worker_get_address`); each peer is a `ucp_ep` created from it with
//! `UCP_ERR_HANDLING_MODE_PEER`, so a dead peer is an error on its operations, not an abort
//! (option `peer_errors`: `auto`, the default, leaves it off where every transport named is
//! shared memory or a CUDA copy, which cannot do it).
//!
//! - Registration: `ucp_mem_map` (host memory; CUDA memory with `UCS_MEMORY_TYPE_CUDA` where
//!   the loaded UCX has it, else [`Error::Unsupported`](transport_core::Error::Unsupported)).
//!   A region's remote key is a byte saying whether it is host or GPU memory, the region's
//!   random 8-byte token, then its `ucp_rkey_pack` blob, framed (`frame.rs`) because UCX
//!   parses a packed key without knowing its length; [`import`](transport_core::Transport::import)
//!   checks the frame and unpacks it once for the peer (`ucp_ep_rkey_unpack`). The endpoint
//!   owns the unpacked keys ([`UcxKey`] is a token into its table) and destroys them before
//!   its `ucp_ep`s.
//! - WRITE: `ucp_put_nbx`. UCP has no put with immediate: a WRITE with an immediate is the
//!   put, then `ucp_ep_flush_nbx` on the peer's endpoint, then, once the flush completed (every
//!   earlier operation to that peer is complete at the target, so the bytes are there), an
//!   active message whose 4-byte header is the immediate (`ucp_am_send_nbx`). The target's
//!   handler turns it into the `RemoteWrite`: it is never delivered before the bytes. The
//!   initiator's `Write` completion comes when the active message has been sent. A WRITE
//!   with an immediate of at most 64 bytes from host memory into host memory, with every
//!   earlier put to that peer covered by a completed flush, is one active message carrying
//!   the immediate, the target address, the region's token (from its key) and the bytes: the
//!   target's handler copies them into the host region it registered under that token, then
//!   queues the immediate (UCX 1.22 runs every put into heap memory over cma, one
//!   `process_vm_writev` each). UCX checks a put's rkey; the token is the handler's check
//!   instead, so a stale or foreign key writes nothing there (the target drops the message and
//!   sees no immediate; the initiator is told of success).
//! - Where UCX would emulate the put (option `write`, `auto`: decided per peer and pair of
//!   memories from its endpoint's lanes, `puts_emulated`: every WRITE over tcp alone, and
//!   WRITEs into or out of GPU memory where no lane reaches both memories, as within one
//!   process over shared memory) a WRITE is such an active message
//!   (`AM_WRITE`, or `AM_WRITE_IMM` with its immediate), of any size: UCX has no RMA over
//!   tcp and emulates a put with an active message that the target acknowledges, and that
//!   acknowledgement, sent to an initiator that died with puts in flight, aborts the
//!   target's process (`ucs_fatal` "unexpected error: Endpoint timeout" under
//!   `ucp_put_handler`, UCX 1.13.1 to 1.22). Into host memory it is sent eager, and ours'
//!   handlers send nothing back. Eager active messages to one peer go on one lane (UCX's
//!   `MAX_EAGER_RAILS` is 1), in order, so an immediate still comes after every earlier
//!   eager WRITE's bytes. Into GPU memory, which the handler cannot copy into with the CPU,
//!   it is sent as a rendezvous (`UCP_AM_SEND_FLAG_RNDV`): the handler has UCX receive the
//!   bytes into the region (`ucp_am_recv_data_nbx`, which stages them through host memory
//!   with cuda_copy), and queues the immediate once that receive completed and every
//!   rendezvous of the same initiator that arrived before it landed too (any immediate waits
//!   behind its own initiator's: the initiator may see a rendezvous WRITE complete while the
//!   target still copies it; each active message names its initiator's worker). UCX's
//!   rendezvous answers the initiator (its ready-to-receive or its acknowledgement) with
//!   sends whose failure UCX handles: it does not abort. A rendezvous naming no region of
//!   the target is refused, and the initiator's WRITE completes with UCX's "Invalid
//!   parameter".
//! - GPU memory: what landed there by UCX's CPU or CUDA copies (shared memory, tcp,
//!   cuda_copy, cuda_ipc) is visible once its completion came;
//!   [`make_gpu_visible`](transport_core::Transport::make_gpu_visible) flushes the NIC's
//!   GPUDirect RDMA writes (where the GPU needs it) for any other transport list, UCX's
//!   default (`all`) and lists of exclusions (`^...`) among them: where the node has an
//!   InfiniBand/RoCE NIC and UCX has CUDA, those may be rc writing GPU memory.
//! - SEND/RECV: tagged messages (`ucp_tag_send_nbx`, `ucp_tag_recv_nbx` from any peer).
//!   Sends, receives and puts name their region's `ucp_mem_map` handle and memory type
//!   (option `memh`). Those of a stream ask for UCX's bandwidth protocols
//!   (`UCP_OP_ATTR_FLAG_MULTI_SEND`), as `ucx_perftest`'s stream tests do on every call; a
//!   ping-pong's do not (`endpoint/stream.rs`).
//! - Progress: [`poll`](transport_core::Transport::poll) calls `ucp_worker_progress` when
//!   it has nothing queued to report (an operation UCX finished inside its post call is
//!   queued at once), and at least every 33rd poll (option `progress_skip`); again, up to 8
//!   calls (1 where the provider names tcp alone), while the last call did something and a send, put or flush is still unfinished
//!   at UCX (option `progress_burst`). Every
//!   operation takes a slot of a fixed table made at open (the request slab) and runs in
//!   that slot's own UCX request (`UCP_OP_ATTR_FIELD_REQUEST`, memory made at open too): UCX's
//!   callbacks write the status into the slot and queue its index in a ring; nothing is
//!   allocated or locked on the post/poll path. (The put of a WRITE with immediate, which
//!   the slot's flush then covers, takes its request from UCX's pool and releases it at
//!   once.)
//!
//! Which transports UCX uses is `NicDesc::provider` (written to the context's `TLS`, as
//! `UCX_TLS` would be: `sm`, `tcp`, `posix,cma,self`, `rc_verbs`), which NIC
//! `NicDesc::device` (`NET_DEVICES`, e.g. `lo`, `mlx5_0:1`); unset, UCX's own defaults and
//! environment apply.
//!
//! The doctor's probe ([`probe()`]) opens a context with what the user named and lists the
//! transports UCX would use, warning where it would fall back to tcp or copy GPU memory
//! through the host.

mod endpoint;
mod frame;
mod log;
mod probe;

pub use endpoint::{Endpoint, UcxKey, UcxMr};
pub use probe::probe;

use transport_core::{BackendInfo, Landing, OptionInfo, ProviderInfo};

/// The options of `NicDesc::options`.
const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        key: "peer_errors",
        values: "auto|on|off",
        help: "UCP_ERR_HANDLING_MODE_PEER on every peer: a dead peer is an error, not an abort \
           or a hang. UCX's shared-memory transports and CUDA copies cannot do it (1.13 and \
           1.22), so auto (the default) is off where every transport named is one of them \
           (sm, posix, sysv, cma, self, cuda_copy, cuda_ipc, gdr_copy), on otherwise; the \
           run record's err_mode says which",
    },
    OptionInfo {
        key: "memh",
        values: "on|off",
        help: "SEND, RECV and WRITE name their region to UCX (UCP_OP_ATTR_FIELD_MEMH and \
           _MEMORY_TYPE: its ucp_mem_map handle and memory type, as ucx_perftest -z does), so \
           UCX does not detect the memory type or register the buffer again per operation \
           (UCX 1.22 makes a memory handle, with malloc and free, for every put that names \
           none); on by default, off for an A/B against ucx_perftest without -z",
    },
    OptionInfo {
        key: "multi_send",
        values: "stream|off",
        help: "which sends, receives and puts ask UCX for its bandwidth protocols \
           (UCP_OP_ATTR_FLAG_MULTI_SEND, part of UCX 1.22's protocol selection; 1.13 reads it \
           only with UCX_PROTO_ENABLE=y): stream (the default) those of a stream, as \
           ucx_perftest's tag_bw and ucp_put_bw do on every call, and none of a ping-pong; \
           off: none, for an A/B of UCX's choices",
    },
    OptionInfo {
        key: "write",
        values: "auto|put|am",
        help: "how a WRITE travels: put (ucp_put_nbx; a WRITE with immediate adds a flush, \
           then the immediate) or am (one active message carrying the bytes, with the \
           immediate if any: eager into host memory, copied into the region by the target's \
           handler; a rendezvous into GPU memory, which the handler has UCX receive into the \
           region). auto (the default) decides per peer and pair of memories: am where UCX \
           would emulate the put, put otherwise. UCX emulates every put where its lanes to \
           the peer carry no RMA but tcp's (tcp alone; all between nodes without RDMA, or on \
           one node with peer error handling), and puts into or out of GPU memory where no \
           lane reaches both memories (cuda_ipc between GPU memories of two processes, or \
           an InfiniBand/RoCE NIC): it sends an active message per fragment and acknowledges \
           each with a send that aborts the target's process (ucs_fatal in ucp_put_handler, \
           UCX 1.13 to 1.22) when the initiator died with puts in flight, and within one \
           process it carried 5 Gbit/s into GPU memory over shared memory",
    },
    OptionInfo {
        key: "progress_skip",
        values: "0..=1024",
        help: "polls in a row that report what is queued already without calling \
           ucp_worker_progress (an operation UCX finished inside its post call needs no \
           progress to be reported; over tcp each progress is a syscall or two); the next \
           poll progresses, as does every poll with nothing queued; 0: every poll, as before \
           (default 32)",
    },
    OptionInfo {
        key: "progress_burst",
        values: "1..=64",
        help: "most ucp_worker_progress calls in one poll: again while the last one did \
           something and a send, put or flush of ours is still unfinished at UCX (over cma \
           each call finishes one put); 1: one call. Default 8, or 1 where the provider \
           names tcp alone (tcp, or tcp,self): each call there is a system call or more, and \
           a burst slowed ours' sends (the run record's progress_burst says which)",
    },
];

/// UCX's shared-memory transports and their aliases.
const SHARED_MEMORY: &[&str] = &[
    "sm", "shm", "posix", "sysv", "cma", "knem", "xpmem", "self", "mm",
];

/// UCX's transports that copy to or from GPU memory on this node (CUDA copies, CUDA IPC, and
/// gdrcopy's CPU copies through the GPU's BAR).
pub(crate) const CUDA_COPIES: &[&str] = &["cuda_copy", "cuda_ipc", "gdr_copy"];

/// Whether every transport `tls` (UCX_TLS) names is one that `is` takes (a `\` prefix and a
/// `:aux` suffix aside). A list that starts with `^` names the transports UCX must not use,
/// which says nothing of those it will: not only these.
fn names_only(tls: Option<&str>, is: impl Fn(&str) -> bool) -> bool {
    tls.is_some_and(|t| {
        !t.trim_start().starts_with('^')
            && t.split(',').all(|x| {
                let x = x.trim().trim_start_matches('\\');
                is(x.split(':').next().unwrap_or(x))
            })
    })
}

/// Whether `tls` names only shared-memory transports and CUDA copies: none of them carries
/// active messages with peer error handling in UCX 1.13 and 1.22 (self, sysv and posix have
/// no peer failure handler; cma and the CUDA copies no active messages: `select.c`'s "no
/// active messages transport"), so a peer can only be reached without it.
pub(crate) fn without_peer_failure(tls: Option<&str>) -> bool {
    names_only(tls, |t| {
        SHARED_MEMORY.contains(&t) || CUDA_COPIES.contains(&t)
    })
}

/// Most `ucp_worker_progress` calls in one poll (option `progress_burst`) where
/// [`default_burst`] does not take 1.
const BURST_DEFAULT: u32 = 8;

/// `progress_burst`'s default for a provider `tls` (UCX_TLS): 1 where it names tcp and at
/// most self beside it, 8 otherwise. Over tcp each progress call is a system call or more
/// (an `epoll_wait`, then a socket's send or receive), and a burst of them in one poll slowed
/// ours' sender on this box: tcp tag 1 MiB by 6-7% where the box ran fastest (tag 64 KiB by
/// 1% in one set, not in a second); the sender read the receiver's control messages in more,
/// smaller calls (docs/measurements.md, U159-U161). Where a progress call finishes one put
/// at a time (cma, UCX 1.22's shared memory) the burst is what keeps ours' loop from turning
/// once a put (U59, U62; 6% at 4 KiB in U160).
pub(crate) fn default_burst(tls: Option<&str>) -> u32 {
    // Only tcp and self, and not self alone (which reaches no other process).
    if names_only(tls, |t| matches!(t, "tcp" | "self")) && !names_only(tls, |t| t == "self") {
        1
    } else {
        BURST_DEFAULT
    }
}

/// How bytes land in this endpoint's GPU regions, for `make_gpu_visible`: UCX's CPU and CUDA
/// copies (shared memory, tcp, cuda_copy, cuda_ipc) have run before their completions; any
/// other transport may be a NIC writing GPU memory by GPUDirect RDMA (rc, dc, ud; and UCX's
/// default `all`, or a list of exclusions, which take whichever the node has), whose writes
/// need the GPU's flush before its next kernel reads them.
pub(crate) fn landing_for(tls: Option<&str>) -> Landing {
    let copy =
        |t: &str| SHARED_MEMORY.contains(&t) || matches!(t, "tcp" | "cuda_copy" | "cuda_ipc");
    if names_only(tls, copy) {
        Landing::ProviderCopy
    } else {
        Landing::NicDma
    }
}

/// Whether UCX's transport (or alias) `t` goes over the machine's InfiniBand/RoCE NICs (rc,
/// ud, dc and their variants, `ib`); the others (shared memory, tcp, CUDA copies) use no NIC.
fn on_nic(t: &str) -> bool {
    t.starts_with("rc") || t.starts_with("ud") || t.starts_with("dc") || t == "ib"
}

/// The NIC driver of a provider naming a transport that goes over a NIC ([`on_nic`]); the
/// others use no NIC of a GPU's group.
fn nic_driver(provider: Option<&str>) -> Option<&'static str> {
    let p = provider?;
    p.split(',')
        .any(|t| on_nic(t.trim().trim_start_matches('^')))
        .then_some("mlx5")
}

/// Whether `tls` names rc_verbs or rc_mlx5 and no transport UCX can wire them up over (tcp,
/// ud, dc, or an alias that brings one: rc, rc_v, rc_x, ib, all): every `ucp_ep_create` then
/// fails with UCX's `no auxiliary transport ... Unsupported operation` (seen with
/// TLS=rc_verbs on Soft-RoCE, ci/ucx-vm-test.sh).
pub(crate) fn rc_without_wireup(tls: &str) -> bool {
    let names: Vec<&str> = tls.split(',').map(str::trim).collect();
    if names.iter().any(|t| t.starts_with('^')) {
        return false;
    }
    let rc = names
        .iter()
        .any(|t| matches!(t.split(':').next(), Some("rc_verbs" | "rc_mlx5")));
    let aux = names.iter().any(|t| {
        let t = t.split(':').next().unwrap_or("");
        matches!(
            t,
            "tcp" | "rc" | "rc_v" | "rc_x" | "ib" | "all" | "dc" | "ud"
        ) || t.starts_with("ud_")
            || t.starts_with("dc_")
    });
    rc && !aux
}

/// The loaded UCX's major and minor version.
pub(crate) fn loaded_version() -> (u32, u32) {
    let (mut major, mut minor, mut release) = (0, 0, 0);
    // SAFETY: three valid out pointers.
    unsafe { ucx_sys::ucp_get_version(&mut major, &mut minor, &mut release) };
    (major, minor)
}

/// What `print` writes into a C stream, as a string (`open_memstream`); empty where the
/// stream could not be opened.
pub(crate) fn printed(print: impl FnOnce(*mut libc::FILE)) -> String {
    let mut buf: *mut libc::c_char = std::ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: buf and len are valid out pointers that live until after fclose.
    let f = unsafe { libc::open_memstream(&mut buf, &mut len) };
    if f.is_null() {
        return String::new();
    }
    print(f);
    // SAFETY: f is open and closed once; fclose sets buf/len to the NUL-terminated text.
    unsafe { libc::fclose(f) };
    if buf.is_null() {
        return String::new();
    }
    // SAFETY: buf is the NUL-terminated buffer open_memstream allocated.
    let s = unsafe { std::ffi::CStr::from_ptr(buf) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: buf was allocated by open_memstream (malloc) and is freed once.
    unsafe { libc::free(buf.cast()) };
    s
}

/// The index of a WRITE's pair of memories in [`puts_emulated`]'s answer (and a peer's
/// `am_writes`): from GPU memory or host memory, into GPU memory or host memory.
pub(crate) const fn write_kind(from_gpu: bool, into_gpu: bool) -> usize {
    ((from_gpu as usize) << 1) | into_gpu as usize
}

/// Which of a peer's puts UCX would emulate with active messages, by the memories on each
/// side (indexed by [`write_kind`]), from its endpoint's lanes (`ucp_ep_print_info`:
/// `lane[0]:  1:tcp/lo.0 md[1] -> ... am am_bw#0 wireup`) that carry RMA (`rma#`,
/// `rma_bw#`):
/// - host memory into host memory: real where any of them is neither tcp nor a CUDA copy
///   (cma, a NIC);
/// - GPU memory into GPU memory: real over cuda_ipc (which UCX 1.22 does not use within one
///   process: "same process") or a NIC (rc, dc; with GPUDirect RDMA, as before);
/// - host memory into GPU memory or back: real over a NIC only (cma moves host memory only,
///   cuda_ipc GPU memory only).
///
/// Elsewhere UCX's protocol is "software emulation": an active message per fragment that the
/// target answers from `ucp_put_handler`, with a send that aborts its process (ucs_fatal, UCX
/// 1.13 to 1.22) where the initiator died with puts in flight (an active message carrying
/// the bytes is not answered), and that over shared memory within one process carried 5-6
/// Gbit/s into GPU memory where a rendezvous active message carried 57-253 (64 KiB to 1 MiB,
/// docs/measurements.md). With peer error handling, UCX 1.13 and 1.22 reach a peer on the
/// same node over tcp too where tcp is named (or `all`): shared memory has no peer failure
/// handler there.
pub(crate) fn puts_emulated(ep_info: &str) -> [bool; 4] {
    let (mut host, mut ipc, mut nic) = (false, false, false);
    let rma_lanes = ep_info
        .lines()
        .filter_map(|l| l.split_once("lane[").map(|(_, rest)| rest))
        .filter(|l| l.split_whitespace().any(|w| w.starts_with("rma")))
        .filter_map(|l| l.split_whitespace().nth(1));
    for rsc in rma_lanes {
        // `1:tcp/lo.0`: the resource index, the transport, the device.
        let tl = rsc.split_once(':').map_or(rsc, |(_, t)| t);
        let tl = tl.split('/').next().unwrap_or(tl);
        host |= tl != "tcp" && !CUDA_COPIES.contains(&tl);
        ipc |= tl == "cuda_ipc";
        nic |= on_nic(tl);
    }
    let mut emulated = [!nic; 4];
    emulated[write_kind(false, false)] = !host;
    emulated[write_kind(true, true)] = !(ipc || nic);
    emulated
}

/// What `write=auto` decided for these peers' WRITEs (each peer's [`puts_emulated`] answer),
/// for the runtime settings: `put`, `am`, which pairs of memories go as active messages, or
/// each of those with its number of peers; "auto" before any peer.
pub(crate) fn auto_writes(peers: impl Iterator<Item = [bool; 4]>) -> String {
    const KINDS: [&str; 4] = ["host to host", "host to GPU", "GPU to host", "GPU to GPU"];
    let described = |am: [bool; 4]| match am {
        [false, false, false, false] => "put".to_string(),
        [true, true, true, true] => "am".to_string(),
        _ => {
            let kinds: Vec<&str> = (0..4).filter(|&k| am[k]).map(|k| KINDS[k]).collect();
            format!("am {}, put otherwise", kinds.join(", "))
        }
    };
    let mut seen: Vec<(String, usize)> = Vec::new();
    for d in peers.map(described) {
        match seen.iter_mut().find(|(s, _)| *s == d) {
            Some((_, n)) => *n += 1,
            None => seen.push((d, 1)),
        }
    }
    match &seen[..] {
        [] => "auto (per peer and memories: am where UCX would emulate the put, else put)".into(),
        [(d, _)] => d.clone(),
        _ => seen
            .iter()
            .map(|(d, n)| format!("{d} to {n} peer(s)"))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// What to say where `ucp_ep_create` over `tls` failed (`unreachable`: with
/// `UCS_ERR_UNREACHABLE`).
pub(crate) fn ep_create_hint(tls: &str, unreachable: bool, peer_errors: bool) -> &'static str {
    if rc_without_wireup(tls) {
        "no auxiliary wire-up transport: UCX connects rc_verbs (rc_mlx5) endpoints over \
         another transport that reaches the peer's worker address first (UCX's `no auxiliary \
         transport ... Unsupported operation`); add one to the transports, e.g. --provider \
         rc_verbs,tcp or rc_verbs,ud_verbs"
    } else if unreachable && peer_errors && without_peer_failure(Some(tls)) {
        "no transport of TLS reaches the peer with peer error handling: UCX's shared-memory \
         transports (self, posix, sysv) have no peer failure handler, and cma and the CUDA \
         copies carry no active messages; add tcp to the transports or pass the option \
         peer_errors=off or auto (a dead peer then hangs operations instead of failing them)"
    } else if unreachable {
        "no transport of TLS reaches the peer's address: is every name in TLS one UCX has here \
         (`ucx_info -d`; UCX skips one it does not know, with a warning on stderr), is the \
         peer still running (UCX cannot connect to a dead one), and are its devices reachable \
         from this node's (UCX_NET_DEVICES)?"
    } else {
        "is the peer's address from a live UCX endpoint, reachable over TLS?"
    }
}

fn no_env(_provider: &str) -> &'static [(&'static str, &'static str)] {
    &[]
}

/// This backend, as `Transport::INFO` gives it.
pub(crate) const INFO: BackendInfo = BackendInfo {
    name: "ucx",
    aliases: &[],
    help: "UCX UCP (puts or active messages, tagged SEND/RECV; --provider is UCX_TLS: sm, tcp, rc_verbs)",
    library: "ucx",
    provider: Some(ProviderInfo {
        names: "UCX_TLS, a transport list: sm, tcp, rc_verbs, sm,cuda_copy,cuda_ipc",
        loopback_default: "sm",
        env: no_env,
    }),
    devices: "UCX_NET_DEVICES: lo, mlx5_0:1",
    nic_driver,
    options: OPTIONS,
    options_env: None,
    same_process_gpu: &[],
    probe: Some(probe::probe),
    exit_abandoning: None,
};

#[cfg(test)]
mod tests {
    #[test]
    fn transport_lists_are_read_as_ucx_reads_them() {
        assert_eq!(super::nic_driver(Some("sm")), None);
        assert_eq!(super::nic_driver(Some("tcp")), None);
        assert_eq!(super::nic_driver(None), None);
        assert_eq!(super::nic_driver(Some("sm,rc_verbs")), Some("mlx5"));
        assert!(super::without_peer_failure(Some("sm")));
        assert!(super::without_peer_failure(Some("posix,cma,self")));
        // The GPU host's list: UCX 1.22 there finds "no active messages transport" with peer
        // error handling.
        assert!(super::without_peer_failure(Some(
            "sm,cuda_copy,cuda_ipc,self"
        )));
        assert!(!super::without_peer_failure(Some("sm,tcp")));
        assert!(!super::without_peer_failure(Some("tcp,cuda_copy")));
        assert!(!super::without_peer_failure(None));
        assert!(!super::without_peer_failure(Some("tcp,\\tcp")));
        assert!(!super::without_peer_failure(Some("^sm")), "all but sm");
        for (tls, want) in [
            (Some("tcp"), 1),
            (Some("tcp,self"), 1),
            (Some(" \\tcp:aux , self"), 1),
            (None, super::BURST_DEFAULT),
            (Some("self"), super::BURST_DEFAULT),
            (Some("sm,tcp"), super::BURST_DEFAULT),
            (Some("^sm"), super::BURST_DEFAULT),
            (Some("tcp,rc_verbs"), super::BURST_DEFAULT),
        ] {
            assert_eq!(super::default_burst(tls), want, "{tls:?}");
        }
        use transport_core::Landing::{NicDma, ProviderCopy};
        for (tls, want) in [
            (None, NicDma),
            (Some("all"), NicDma),
            (Some("^sm"), NicDma),
            (Some("rc_verbs,tcp"), NicDma),
            (Some("sm,rc_mlx5,cuda_copy"), NicDma),
            (Some("gdr_copy,cuda_copy"), NicDma),
            (Some("sm,cuda_copy,cuda_ipc,self"), ProviderCopy),
            (Some("tcp"), ProviderCopy),
            (Some("sm"), ProviderCopy),
        ] {
            assert_eq!(super::landing_for(tls), want, "UCX_TLS={tls:?}");
        }
        assert!(super::rc_without_wireup("rc_verbs"));
        assert!(super::rc_without_wireup("rc_mlx5,sm"));
        assert!(!super::rc_without_wireup("rc_verbs,tcp"));
        assert!(!super::rc_without_wireup("rc_verbs,ud_verbs"));
        assert!(!super::rc_without_wireup("rc"));
        assert!(!super::rc_without_wireup("sm"));
        assert!(!super::rc_without_wireup("all"));
    }

    #[test]
    fn puts_are_emulated_where_no_lane_reaches_both_memories() {
        // Lanes as UCX 1.13.1 and 1.22.0 print them (tcp; sm with peer errors off; rc_verbs
        // and tcp in the Soft-RoCE VM; a CUDA copy beside tcp; shared memory with the CUDA
        // transports, between two processes and within one, where cuda_ipc is unreachable).
        let tcp_113 = "#                 lane[0]:  1:tcp/lo.0 md[1]  -> md[1]/tcp/sysdev[255] am am_bw#0 keepalive wireup\n";
        let tcp_122 = "lane[0]:  1:tcp/lo.0 md[0]  -> addr[1].md[0]/tcp/sysdev[255] seg 4294967295 am keepalive wireup\n";
        let sm = "lane[0]:  0:sysv/memory.0 md[0] -> addr[0].md[0]/sysv/sysdev[255] am am_bw#0
lane[1]:  1:posix/memory.0 md[1] -> addr[1].md[1]/posix/sysdev[255]
lane[2]:  2:cma/memory.0 md[2] -> addr[2].md[2]/cma/sysdev[255] rma_bw#0
";
        let sm_ipc = format!(
            "{sm}lane[3]:  4:cuda_ipc/cuda.0 md[4] -> addr[3].md[4]/cuda_ipc/sysdev[0] rma_bw#1\n\
             lane[4]:  3:cuda_copy/cuda.0 md[3] -> addr[2].md[3]/cuda_cpy/sysdev[255] rma_bw#2\n"
        );
        let sm_one = format!(
            "{sm}lane[3]:  3:cuda_copy/cuda.0 md[3] -> addr[2].md[3]/cuda_cpy/sysdev[255] rma_bw#1\n"
        );
        let rc = "lane[0]:  1:rc_verbs/rxe0:1.0 md[1] -> addr[1].md[1]/ib/sysdev[255] rma_bw#0 am am_bw#0
lane[1]:  0:tcp/veth0.0 md[0] -> addr[0].md[0]/tcp/sysdev[255] keepalive wireup
";
        let tcp_put = "lane[0]:  0:tcp/eth0.0 md[0] -> md[0]/tcp rma#0 rma_bw#0 am am_bw#0\n\
                       lane[1]:  3:cuda_copy/cuda.0 md[3] -> md[3]/cuda_cpy rma_bw#1\n";
        // [host into host, host into GPU, GPU into host, GPU into GPU]
        assert_eq!(super::puts_emulated(tcp_113), [true; 4]);
        assert_eq!(super::puts_emulated(tcp_122), [true; 4]);
        assert_eq!(super::puts_emulated(tcp_put), [true; 4]);
        assert_eq!(super::puts_emulated(sm), [false, true, true, true]);
        assert_eq!(super::puts_emulated(&sm_ipc), [false, true, true, false]);
        assert_eq!(super::puts_emulated(&sm_one), [false, true, true, true]);
        assert_eq!(super::puts_emulated(rc), [false; 4]);
        assert_eq!(super::puts_emulated(""), [true; 4]);
        assert_eq!(super::write_kind(true, false), 2);
        let said = |p: &[[bool; 4]]| super::auto_writes(p.iter().copied());
        assert!(said(&[]).starts_with("auto"));
        assert_eq!(said(&[[true; 4], [true; 4]]), "am");
        assert_eq!(
            said(&[[false, true, true, true], [false; 4]]),
            "am host to GPU, GPU to host, GPU to GPU, put otherwise to 1 peer(s); put to 1 peer(s)"
        );
    }

    #[test]
    fn an_unreachable_peer_is_blamed_on_shared_memory_only_where_tls_is_local() {
        // A peer that died before this side connected to it (seen over rc_verbs,tcp when a
        // client was killed during its session's setup) is not a shared-memory matter.
        let sm = "shared-memory transports";
        assert!(super::ep_create_hint("sm", true, true).contains(sm));
        assert!(super::ep_create_hint("sm,cuda_copy,cuda_ipc", true, true).contains(sm));
        assert!(!super::ep_create_hint("rc_verbs,tcp", true, true).contains(sm));
        assert!(super::ep_create_hint("tcp", true, true).contains("still running"));
        assert!(super::ep_create_hint("rc_verbs", true, true).contains("auxiliary"));
    }
}
