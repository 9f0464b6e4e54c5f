//! Sample messages, one of each kind, for the protocol's unit tests.

use transport_core::{KeyBytes, RemoteMr, Runtime};

use super::{
    Hello, Join, LinkStats, LinkWire, Links, NicWire, RankDone, RankSpec, Request, RunSpec,
};
use super::{CTRL_LEN, MAGIC, VERSION};
use crate::config::{Knobs, LatOp, MemKind, Pattern, Threads, Workload};
use crate::record::{Cuda, Facts};

pub(super) fn nic(gpu: u32) -> NicWire {
    NicWire {
        gpu,
        name: "lo".into(),
        addr: vec![1, 2, 3],
        mrs: vec![
            RemoteMr {
                addr: 0,
                len: 1 << 20,
                key: KeyBytes::from_u64(7),
            },
            RemoteMr {
                addr: 4096,
                len: CTRL_LEN as u64,
                // A packed key of the length UCX makes on a host with several NICs.
                key: KeyBytes::new((0..200).map(|i| i as u8).collect::<Vec<u8>>()).unwrap(),
            },
        ],
        max_write_size: 1 << 30,
        max_msg_size: 1 << 20,
        rx_depth: 128,
        link_gbps: None,
    }
}

pub(crate) fn hello() -> Hello {
    Hello {
        magic: MAGIC.into(),
        version: VERSION,
        backend: "efa".into(),
        provider: "shm".into(),
        gpus: 2,
        nics_per_gpu: 1,
        mem: MemKind::Host,
        buf_offset: 0,
        nics: vec![nic(0), nic(1)],
    }
}

/// A side's run-record facts, every field filled.
pub(crate) fn facts() -> Facts {
    Facts {
        rdma_bench: "0.1.0".into(),
        commit: "0123456789abcdef0123456789abcdef01234567".into(),
        host: "node01".into(),
        kernel: "6.1.0-28-amd64".into(),
        instance: Some("p5".into()),
        cuda: Some(Cuda {
            driver: "12.8".into(),
            gpus: vec!["NVIDIA H100 80GB HBM3".into()],
        }),
        backend: Some(Runtime {
            backend: "efa".into(),
            library: "libfabric".into(),
            version: Some("2.6.0".into()),
            path: Some("/opt/amazon/efa/lib/libfabric.so.1".into()),
            provider: Some("efa".into()),
            fabric: Some("efa".into()),
            device: "rdmap79s0-rdm".into(),
            firmware: Some("0.0.1".into()),
            settings: [("api_version".to_string(), "2.6".to_string())].into(),
        }),
    }
}

pub(super) fn request() -> Request {
    Request {
        id: 1,
        workload: Workload::Write,
        size: 4096,
        count: 16,
        iters: 3,
        seed: 9,
        op: LatOp::WriteImm,
        knobs: Knobs {
            threads: Threads::PerGpu,
            ..Knobs::baseline()
        },
        imm_every: 1,
        verify: true,
        shifts: 64,
    }
}

pub(super) fn join() -> Join {
    Join {
        magic: MAGIC.into(),
        version: VERSION,
        rank: 1,
        world: 4,
        local_rank: 1,
        host: "node01".into(),
        pid: 42,
        spec: RankSpec {
            build: "0.1.0".into(),
            backend: "efa".into(),
            provider: "shm".into(),
            pattern: Pattern::AllToAll,
            workload: Workload::Write,
            gpus: 2,
            nics_per_gpu: 2,
            mem: MemKind::Host,
            seed: 1,
            verify: true,
            runs: vec![RunSpec {
                stage: None,
                size: 4096,
                pages: 16,
                iters: 3,
                knobs: Knobs::baseline(),
            }],
        },
    }
}

fn link(send: bool) -> LinkWire {
    LinkWire {
        peer: 2,
        nic: 1,
        send,
        name: "rdmap0".into(),
        addr: vec![9; 32],
        // Receiving: the landing region; sending: the region whose pad takes the
        // acknowledgement.
        mr: Some(RemoteMr {
            addr: if send { 1 << 30 } else { 4096 },
            len: 1 << 20,
            key: KeyBytes::from_u32(3),
        }),
        max_write_size: 1 << 30,
    }
}

pub(super) fn links() -> Links {
    Links {
        rank: 1,
        links: vec![link(true), link(false)],
    }
}

pub(super) fn rank_done() -> RankDone {
    RankDone {
        rank: 3,
        id: 0,
        seconds: 0.5,
        verified: true,
        nics: vec!["a".into(), "b".into()],
        links: vec![LinkStats {
            peer: 0,
            nic: 1,
            send: true,
            bytes: 10,
            ops: 1,
            seconds: 0.25,
        }],
        cores: vec![3],
        facts: Some(Box::new(facts())),
    }
}
