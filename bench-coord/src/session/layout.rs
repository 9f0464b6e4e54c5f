//! The server's configuration, and the side each session gets: the layout (GPUs, NICs per
//! GPU, memory) the client's hello asks for, within what this node has and what the operator
//! fixed with flags.

use std::time::Duration;

use bench_core::config::MemKind;
use bench_core::error::{Error, Result};
use bench_core::proto::Hello;
use bench_core::side::{Side, SideCfg};
use transport_core::Transport;

/// The server's configuration.
#[derive(Clone, Debug)]
pub struct ServerCfg {
    /// This node's side. Its GPUs, NICs per GPU and memory are each client's (its hello's),
    /// within what this node has, except where `fixed` says the operator gave them.
    pub side: SideCfg,
    /// Which of `side`'s layout the operator gave (flags): those are not the client's to
    /// choose.
    pub fixed: Fixed,
    pub max_mem: u64,
    pub session_timeout: Duration,
    pub max_sessions: usize,
    pub sessions: Option<u64>,
    /// Do not log sessions (loopback: the client reports).
    pub quiet: bool,
}

/// Which parts of the server's layout its operator gave; each other part is taken from each
/// client's hello, as perftest's server takes the client's parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fixed {
    /// `--gpus`: the GPUs the server serves from; a client asking for N of them gets the first
    /// N (more than the list holds is refused).
    pub gpus: bool,
    /// `--nics-per-gpu`: a client must ask for as many.
    pub nics_per_gpu: bool,
    /// `--mem`: the server's buffers are of this kind, whatever the client's are.
    pub mem: bool,
}

impl Fixed {
    /// Everything fixed: the server's side is as given (loopback, whose two sides are one
    /// command's).
    pub const ALL: Fixed = Fixed {
        gpus: true,
        nics_per_gpu: true,
        mem: true,
    };
}

/// This session's side: `cfg.side`, with the GPUs, NICs per GPU and memory that `cfg.fixed`
/// leaves open taken from the client's hello, within what this node has. An error names what
/// the client asks for that this server cannot give, and why.
pub fn session_side(cfg: &ServerCfg, hello: &Hello) -> Result<SideCfg> {
    let (n, k) = (hello.gpus as usize, hello.nics_per_gpu as usize);
    let asks = format!(
        "the client asks for {n} GPU(s) x {k} NIC(s), {} memory",
        hello.mem
    );
    let mut side = cfg.side.clone();
    if !cfg.fixed.mem {
        side.mem = hello.mem;
    }
    // The client's experiment: this side's regions sit in their pages as the client's do.
    side.buf_offset = hello.buf_offset;
    side.gpus = if cfg.fixed.gpus {
        let have = &cfg.side.gpus;
        if n > have.len() {
            return Err(Error::Protocol(format!(
                "{asks}; this server serves {} GPU(s) (--gpus {}): start it with more, or \
                 without --gpus to serve what the client asks",
                have.len(),
                list(have)
            )));
        }
        have[..n].to_vec()
    } else {
        let (here, why) = side
            .gpus_here()
            .map_err(|e| Error::Protocol(format!("{asks}; this node cannot: {e}")))?;
        if n > here {
            return Err(Error::Protocol(format!(
                "{asks}; this node has {here} ({why})"
            )));
        }
        (0..n).collect()
    };
    if cfg.fixed.nics_per_gpu {
        if k != cfg.side.nics_per_gpu {
            return Err(Error::Protocol(format!(
                "layout mismatch: {asks}; this server was started with --nics-per-gpu {}: give \
                 both the same, or start the server without it to take the client's",
                cfg.side.nics_per_gpu
            )));
        }
    } else {
        side.nics_per_gpu = k;
        // Over this node's own NICs, each GPU's endpoints go to its NIC group (topo): more
        // endpoints than the group has NICs would share NICs, which the operator asks for
        // with --nics-per-gpu, and a client cannot.
        let groups = side
            .hints
            .as_ref()
            .filter(|_| side.real_nics && side.devices.is_empty());
        if let Some(h) = groups {
            for &g in &side.gpus {
                let grp = h.nic_groups.get(g).map_or(&[][..], |v| &v[..]);
                if !grp.is_empty() && k > grp.len() {
                    let names: Vec<&str> = grp.iter().map(|n| n.name.as_str()).collect();
                    return Err(Error::Protocol(format!(
                        "{asks}; GPU {g}'s NIC group on this node has {} NIC(s) ({}): ask \
                         for at most {}, or start the server with --nics-per-gpu {k} to share them",
                        grp.len(),
                        names.join(", "),
                        grp.len()
                    )));
                }
            }
        }
    }
    side.check()
        .map_err(|e| Error::Protocol(format!("{asks}; this server cannot: {e}")))?;
    // The run record's CUDA facts are those of the GPUs this session uses.
    if side.mem == MemKind::Cuda {
        if cfg.side.mem != MemKind::Cuda || side.gpus != cfg.side.gpus {
            side.facts.cuda = bench_core::record::cuda(&side.gpus);
        }
    } else {
        side.facts.cuda = None;
    }
    Ok(side)
}

/// `0,1,4` as typed.
fn list(gpus: &[usize]) -> String {
    gpus.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// What the server says it serves, in its first line: each client's layout, but for what
/// the operator fixed.
pub(super) fn layout_line(cfg: &ServerCfg) -> String {
    let f = cfg.fixed;
    let mut fixed = Vec::new();
    if f.gpus {
        fixed.push(format!("GPUs {}", list(&cfg.side.gpus)));
    }
    if f.nics_per_gpu {
        fixed.push(format!("{} NIC(s) per GPU", cfg.side.nics_per_gpu));
    }
    if f.mem {
        fixed.push(format!("{} memory", cfg.side.mem));
    }
    if fixed.len() == 3 {
        format!("layout {}", fixed.join(", "))
    } else if fixed.is_empty() {
        "each client's layout (GPUs, NICs per GPU, memory)".into()
    } else {
        format!("each client's layout within {}", fixed.join(", "))
    }
}

/// One side's data regions, for `-v`: their length, memory and where in a page they start
/// (`--buf-offset`, read off the first region itself).
pub(super) fn regions_line<T: Transport>(side: &Side<T>, mem: MemKind, len: u64) -> String {
    format!(
        "data regions: {len} bytes of {mem} memory per NIC, starting {} bytes into a page",
        side.data_page_offset()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bench_core::buffers;
    use bench_core::proto::{MAGIC, VERSION};
    use bench_core::topo_glue::{Hints, NicRef};

    fn cfg(side: SideCfg, fixed: Fixed) -> ServerCfg {
        ServerCfg {
            side,
            fixed,
            max_mem: u64::MAX,
            session_timeout: Duration::from_secs(1),
            max_sessions: 1,
            sessions: None,
            quiet: true,
        }
    }

    fn hello(gpus: u32, nics_per_gpu: u32, mem: MemKind) -> Hello {
        Hello {
            magic: MAGIC.into(),
            version: VERSION,
            backend: "libfabric".into(),
            provider: "shm".into(),
            gpus,
            nics_per_gpu,
            mem,
            buf_offset: 0,
            nics: Vec::new(),
        }
    }

    /// A node of `gpus` GPUs, each with a NIC group of `per` NICs.
    fn node(gpus: usize, per: usize) -> SideCfg {
        let nic = |g: usize, j: usize| NicRef {
            name: format!("rdmap{g}s{j}"),
            pci: None,
        };
        SideCfg {
            hints: Some(Hints {
                gpus,
                nic_groups: (0..gpus)
                    .map(|g| (0..per).map(|j| nic(g, j)).collect())
                    .collect(),
                cores: vec![Vec::new(); gpus],
            }),
            ..SideCfg::default()
        }
    }

    fn err(r: Result<SideCfg>) -> String {
        r.map(|s| format!("{:?} x {}", s.gpus, s.nics_per_gpu))
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn the_clients_layout_is_taken() {
        let c = cfg(SideCfg::default(), Fixed::default());
        let s = session_side(&c, &hello(2, 2, MemKind::Host)).unwrap();
        assert_eq!(
            (s.gpus, s.nics_per_gpu, s.mem),
            (vec![0, 1], 2, MemKind::Host)
        );
        // Within this node's NIC groups: 8 GPUs of 4 NICs each (a p5).
        let c = cfg(node(8, 4), Fixed::default());
        let s = session_side(&c, &hello(8, 4, MemKind::Host)).unwrap();
        assert_eq!((s.gpus.len(), s.nics_per_gpu), (8, 4));
    }

    #[test]
    fn what_this_node_has_not_is_refused() {
        // The case: a client of 8 GPUs x 4 NICs, a node of 1 GPU.
        let c = cfg(node(1, 4), Fixed::default());
        assert_eq!(
            err(session_side(&c, &hello(8, 4, MemKind::Host))),
            "the client asks for 8 GPU(s) x 4 NIC(s), host memory; this node has 1 (this \
             machine has 1 GPU(s))"
        );
        // More NICs per GPU than a GPU's NIC group holds.
        let c = cfg(node(2, 2), Fixed::default());
        let e = err(session_side(&c, &hello(2, 4, MemKind::Host)));
        assert!(
            e.contains("GPU 0's NIC group on this node has 2 NIC(s) (rdmap0s0, rdmap0s1)"),
            "{e}"
        );
        // A provider that copies memory has no NIC groups to respect.
        let mut side = node(2, 2);
        side.real_nics = false;
        let s = session_side(&cfg(side, Fixed::default()), &hello(2, 4, MemKind::Host)).unwrap();
        assert_eq!(s.nics_per_gpu, 4);
        // GPU memory where there is none.
        if !buffers::cuda_driver() {
            let c = cfg(SideCfg::default(), Fixed::default());
            let e = err(session_side(&c, &hello(1, 1, MemKind::Cuda)));
            assert!(
                e.starts_with(
                    "the client asks for 1 GPU(s) x 1 NIC(s), cuda memory; this node cannot"
                ),
                "{e}"
            );
        }
    }

    #[test]
    fn the_operators_flags_hold() {
        // --gpus 4,5,6: a client of 2 gets the first 2; of 4, a refusal naming the list.
        let mut side = node(8, 2);
        side.gpus = vec![4, 5, 6];
        let only = Fixed {
            gpus: true,
            ..Fixed::default()
        };
        let c = cfg(side.clone(), only);
        assert_eq!(
            session_side(&c, &hello(2, 1, MemKind::Host)).unwrap().gpus,
            vec![4, 5]
        );
        let e = err(session_side(&c, &hello(4, 1, MemKind::Host)));
        assert!(
            e.contains("this server serves 3 GPU(s) (--gpus 4,5,6)"),
            "{e}"
        );
        // --nics-per-gpu 4: the client must ask as many, and the NICs are shared by the
        // operator's choice.
        side.nics_per_gpu = 4;
        let npg = Fixed {
            nics_per_gpu: true,
            ..Fixed::default()
        };
        let c = cfg(side.clone(), npg);
        assert_eq!(
            session_side(&c, &hello(2, 4, MemKind::Host))
                .unwrap()
                .nics_per_gpu,
            4
        );
        let e = err(session_side(&c, &hello(2, 2, MemKind::Host)));
        assert!(
            e.starts_with("layout mismatch: ") && e.contains("--nics-per-gpu 4"),
            "{e}"
        );
        // --mem host: the server's buffers stay in host memory for a client of GPU memory.
        let mem = Fixed {
            mem: true,
            ..Fixed::default()
        };
        let s = session_side(&cfg(SideCfg::default(), mem), &hello(1, 1, MemKind::Cuda)).unwrap();
        assert_eq!(s.mem, MemKind::Host);
        // Everything fixed (loopback): the side as given.
        let s = session_side(&cfg(side, Fixed::ALL), &hello(3, 4, MemKind::Host)).unwrap();
        assert_eq!((s.gpus, s.nics_per_gpu), (vec![4, 5, 6], 4));
    }
}
