//! GPU memory (feature `cuda`): registration where the provider has `FI_HMEM`, and a clear
//! `Unsupported` error where it has not. Skipped without a CUDA driver and device, saying so
//! on stderr (`--nocapture` shows it).
//!
//! `REQUIRE_CUDA_PROVIDER=1` (set on the GPU host, with a CUDA-enabled libfabric 2.x) turns
//! every skip and every "cannot register here" into a failure: the GPU-to-GPU WRITE over
//! `shm` must then run and verify.

#![cfg(feature = "cuda")]

use std::time::{Duration, Instant};

use transport_core::{
    cuda_device_count, cuda_driver_present, Completion, CompletionKind, Error, GpuBuffer,
    LocalSlice, Memory, MemoryRegion, NicDesc, Post, Transport,
};
use transport_efa::Endpoint;

const LEN: usize = 1 << 20;

fn required() -> bool {
    std::env::var_os("REQUIRE_CUDA_PROVIDER").is_some()
}

fn gpu_present() -> bool {
    if !cuda_driver_present() || cuda_device_count().unwrap_or(0) == 0 {
        assert!(
            !required(),
            "REQUIRE_CUDA_PROVIDER is set, but no CUDA driver or device"
        );
        transport_core::skip::note("no CUDA device", "no CUDA driver or device on this machine");
        return false;
    }
    true
}

/// A skip for want of a CUDA-capable provider: fatal under `REQUIRE_CUDA_PROVIDER`.
fn no_cuda_provider(why: &str) {
    assert!(!required(), "REQUIRE_CUDA_PROVIDER is set: {why}");
    transport_core::skip::note("no CUDA-capable libfabric", why);
}

/// Whether libfabric `version`'s tcp provider offers `FI_HMEM`: not in any release this
/// project builds against (1.17.1, 2.1.0, 2.6.0: prov/tcp never sets it, and tcp;ofi_rxm asks
/// its tcp core for it), CUDA-enabled or not. A newer release fails here until someone checks
/// its prov/tcp (as `transport-efa/src/endpoint.rs`'s `tcp_has_fi_hmem` does).
fn tcp_has_fi_hmem(version: &str) -> bool {
    let mut it = version.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
    let v = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    assert!(
        v <= (2, 6),
        "libfabric {version} is newer than what this test knows of tcp's FI_HMEM (none through \
         2.6): check its prov/tcp and extend tcp_has_fi_hmem"
    );
    false
}

/// tcp has no FI_HMEM in the libfabric releases we run (the GPU host's CUDA-enabled 2.6.0
/// included): registering GPU memory is refused, naming why.
#[test]
fn gpu_memory_without_fi_hmem_is_unsupported() {
    if !gpu_present() {
        return;
    }
    let version = Endpoint::libfabric_version();
    assert!(!tcp_has_fi_hmem(&version));
    let mut nic = NicDesc::provider("tcp");
    nic.device = Some("lo".into());
    let mut ep = Endpoint::open(&nic).expect("open tcp");
    assert!(
        !ep.caps().gpu_memory,
        "libfabric {version}: {:?}",
        ep.caps()
    );
    let g = GpuBuffer::alloc(0, LEN).expect("cudaMalloc");
    match ep.register(Memory::Gpu(g)) {
        Err(Error::Unsupported(m)) => {
            eprintln!("tcp: {m}");
            assert!(m.contains("FI_HMEM"), "{m}");
        }
        Ok(_) => panic!("libfabric {version}'s tcp has no FI_HMEM, yet GPU memory registered"),
        Err(e) => panic!("expected Unsupported, got {e}"),
    }
}

/// shm with hmem=on, both endpoints in this process (so `gpu_ipc=off`: CUDA IPC cannot
/// work within one process, and shm copies through the host): either a GPU-to-GPU WRITE with
/// immediate works and the bytes arrive, or opening / registering fails with a clear error
/// (libfabric built without CUDA). `tests/gpu_ipc.rs` runs the two-process case.
#[test]
fn gpu_write_with_immediate_over_shm() {
    if !gpu_present() {
        return;
    }
    let nic = NicDesc::provider("shm")
        .with_option("hmem", "on")
        .with_option("gpu_ipc", "off");
    let (mut a, mut b) = match (Endpoint::open(&nic), Endpoint::open(&nic)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            assert!(matches!(e, Error::Unsupported(_)), "{e}");
            no_cuda_provider(&format!("shm hmem=on does not open: {e}"));
            return;
        }
    };
    eprintln!(
        "shm hmem=on: libfabric {}, mr_mode {}, caps {:?}",
        Endpoint::libfabric_version(),
        a.mr_mode(),
        a.caps()
    );
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 13 + 5) as u8).collect();
    let mut src_mem = Memory::Gpu(GpuBuffer::alloc(0, LEN).expect("cudaMalloc"));
    src_mem.write_at(0, &pattern).expect("copy to the GPU");
    let src = match a.register(src_mem) {
        Ok(mr) => mr,
        Err(e) => {
            // A libfabric without CUDA support (Debian's, Ubuntu's) offers FI_HMEM on shm
            // but cannot register CUDA memory: that must be a clear Unsupported.
            assert!(matches!(e, Error::Unsupported(_)), "{e}");
            no_cuda_provider(&format!("shm cannot register GPU memory here: {e}"));
            return;
        }
    };
    let dst = b
        .register(Memory::Gpu(GpuBuffer::alloc(0, LEN).expect("cudaMalloc")))
        .expect("register the target");
    let to_b = a.add_peer(&b.address()).expect("add_peer");
    b.add_peer(&a.address()).expect("add_peer");
    let remote = a.import(to_b, &dst.remote()).expect("import");

    let start = Instant::now();
    let mut buf: [Completion; 16] = Default::default();
    let (mut posted, mut wrote, mut landed) = (false, false, false);
    while !(wrote && landed) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "GPU write did not complete"
        );
        if !posted {
            posted = a
                .post_write(to_b, LocalSlice::all(&src), remote.all(), Some(9), 1)
                .expect("post_write")
                == Post::Posted;
        }
        let n = a.poll(&mut buf).expect("poll");
        for c in &buf[..n] {
            c.check().expect("write completion");
            wrote |= c.kind == CompletionKind::Write;
        }
        let n = b.poll(&mut buf).expect("poll");
        for c in &buf[..n] {
            c.check().expect("target completion");
            landed |= c.kind == CompletionKind::RemoteWrite { imm: 9 };
        }
    }
    let mut got = vec![0u8; LEN];
    dst.memory()
        .read_at(0, &mut got)
        .expect("copy from the GPU");
    assert!(got == pattern, "GPU bytes differ");
    eprintln!("shm: 1 MiB GPU-to-GPU WRITE with immediate verified");
}

/// GPU buffers are `cuMemAlloc` memory that GPUDirect RDMA can pin, at every size from 4 KiB
/// to 1 GiB, and a dmabuf can be exported for the whole buffer and for a sub-range that does
/// not start on a page (what a region of part of a buffer registers).
///
/// The allocation went through cudarc's stream allocator, which uses `cuMemAllocAsync` on
/// GPUs with memory pools: on the H100 host (driver 580) such pointers report
/// `CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 0` at every size, so nvidia-peermem and
/// EFA could not pin them (and CUDA IPC, shm's device-to-device path, cannot export them).
/// On a p5 that is the difference between GPUDirect RDMA and no GPU path at all.
#[test]
fn gpu_buffers_are_gpudirect_capable_and_export_dmabufs() {
    if !gpu_present() {
        return;
    }
    for len in [4 << 10, 64 << 10, 1 << 20, 64 << 20, 1 << 30] {
        let g = GpuBuffer::alloc(0, len).expect("cuMemAlloc");
        let capable = g.gpudirect_rdma_capable().expect("pointer attribute");
        eprintln!(
            "{len} bytes at {:#x}: GPUDirect RDMA capable {capable}",
            g.device_ptr()
        );
        assert!(capable, "{len}-byte buffer is not GPUDirect RDMA capable");
        match g.export_dmabuf(0, len) {
            Ok(d) => {
                assert_eq!(d.range.base_addr + d.range.offset, g.device_ptr());
                assert!(d.range.export_len >= len as u64);
            }
            Err(e) if !required() => {
                transport_core::skip::note("no dmabuf export", &e.to_string());
                continue;
            }
            Err(e) => panic!("dmabuf export of {len} bytes: {e}"),
        }
        let (off, sub) = (0x234, 4096.min(len - 0x234));
        let d = g
            .export_dmabuf(off, sub)
            .expect("dmabuf export of a sub-range");
        assert_eq!(
            d.range.base_addr + d.range.offset,
            g.device_ptr() + off as u64
        );
        assert_eq!(d.range.base_addr % transport_core::PAGE as u64, 0);
        assert!(g.export_dmabuf(len - 1, 2).is_err(), "past the end");
    }
}

/// Every `GpuBuffer::alloc` carries `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` (what keeps shm's
/// CUDA copies ahead of their completions, `tests/gpu_visibility.rs`), and the hidden
/// allocation without it really lacks it (so that test's "before" shows the race). Each
/// buffer knows what makes GPUDirect RDMA writes into it visible; the call that does it
/// succeeds on this GPU (a no-op where the device orders them, Hopper and later).
#[test]
fn gpu_buffers_carry_sync_memops_and_a_flush_plan() {
    if !gpu_present() {
        return;
    }
    for len in [4 << 10, 1 << 20, 256 << 20] {
        let g = GpuBuffer::alloc(0, len).expect("cuMemAlloc");
        assert!(g.sync_memops().expect("pointer attribute"), "{len} bytes");
        let plan = g.gpudirect_flush();
        let m = Memory::Gpu(g);
        let r = transport_core::make_gpu_visible(&m, transport_core::Landing::NicDma);
        eprintln!("{len} bytes: SYNC_MEMOPS set, GPUDirect flush plan {plan:?}: {r:?}");
        if plan != transport_core::GpuDirectFlush::Unsupported {
            r.expect("making GPUDirect RDMA writes visible");
        }
        transport_core::make_gpu_visible(&m, transport_core::Landing::ProviderCopy)
            .expect("provider copies need nothing");
        let u = GpuBuffer::alloc_without_sync_memops(0, len).expect("cuMemAlloc");
        assert!(!u.sync_memops().expect("pointer attribute"), "{len} bytes");
    }
}

/// `--buf-offset` on GPU memory (`GpuBuffer::alloc_at_page_offset`): the region starts that
/// many bytes into a 4 KiB page, is as long as asked, carries SYNC_MEMOPS, and its bytes are
/// written and read back there; 0 is `alloc`'s placement, and a page or more is refused.
#[test]
fn gpu_regions_start_where_alloc_at_page_offset_puts_them() {
    if !gpu_present() {
        return;
    }
    let len = 3 * 4096 + 100;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    for skew in [0usize, 512, 4095] {
        let g = GpuBuffer::alloc_at_page_offset(0, len, skew).expect("cuMemAlloc");
        if skew > 0 {
            assert_eq!(g.device_ptr() % 4096, skew as u64, "{g:?}");
        }
        assert_eq!(g.len(), len);
        assert!(g.sync_memops().expect("pointer attribute"), "skew {skew}");
        let mut m = Memory::Gpu(g);
        m.write_at(0, &data).expect("write into the region");
        let mut back = vec![0u8; len];
        m.read_at(0, &mut back).expect("read the region back");
        assert!(back == data, "skew {skew}: the bytes read back differ");
    }
    let e = GpuBuffer::alloc_at_page_offset(0, 64, 4096).expect_err("a page in is refused");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

/// What a consumer calls after a GPU region's completions, through the trait: over shm (CUDA
/// copies) it succeeds at once.
#[test]
fn make_gpu_visible_over_shm_succeeds() {
    if !gpu_present() {
        return;
    }
    let nic = NicDesc::provider("shm")
        .with_option("hmem", "on")
        .with_option("gpu_ipc", "off");
    let mut ep = match Endpoint::open(&nic) {
        Ok(ep) => ep,
        Err(e) => {
            no_cuda_provider(&format!("shm hmem=on does not open: {e}"));
            return;
        }
    };
    let mr = match ep.register(Memory::Gpu(GpuBuffer::alloc(0, LEN).expect("cuMemAlloc"))) {
        Ok(mr) => mr,
        Err(e) => {
            no_cuda_provider(&format!("shm cannot register GPU memory here: {e}"));
            return;
        }
    };
    ep.make_gpu_visible(&mr).expect("make_gpu_visible");
}
