//! Sample messages, one of each kind, for the protocol's unit tests.

use transport_core::RemoteMr;

use super::{
    Hello, Join, LinkStats, LinkWire, Links, NicWire, RankDone, RankSpec, Request, RunSpec,
};
use super::{CTRL_LEN, MAGIC, VERSION};
use crate::config::{Knobs, LatOp, MemKind, Pattern, Threads, Workload};

pub(super) fn nic(gpu: u32) -> NicWire {
    NicWire {
        gpu,
        name: "lo".into(),
        addr: vec![1, 2, 3],
        mrs: vec![
            RemoteMr {
                addr: 0,
                len: 1 << 20,
                key: 7,
            },
            RemoteMr {
                addr: 4096,
                len: CTRL_LEN as u64,
                key: 8,
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
        nics: vec![nic(0), nic(1)],
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
            key: 3,
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
    }
}
