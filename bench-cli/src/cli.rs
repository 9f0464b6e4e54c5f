//! The command line (clap derive). Vocabulary follows perftest where it has a word:
//! `-s` size, `-n` iterations.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{Backend, LatOp, MemKind, Threads, Workload};
use crate::units::{GpuList, Pair, Size};

/// One RDMA benchmark for every backend: EFA (libfabric) and verbs, GPU or host memory,
/// with each step of the 3200 Gbps write-up as a knob.
#[derive(Debug, Parser)]
#[command(name = "rdma-bench", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// GPUs, their NIC groups and nearby cores (from hwloc).
    Topo(TopoArgs),
    /// Both sides on this machine: two endpoint sets, each driven by its own thread.
    Loopback(LoopbackArgs),
    /// Serve benchmark clients until stopped; each client gets its own endpoints.
    Server(ServerArgs),
    /// Run a workload against a server.
    Client(ClientArgs),
    /// Run one workload over several backend:provider pairs (in loopback), side by side.
    Compare(CompareArgs),
    /// Check this node before a run: RDMA devices and links, libfabric, GPU memory paths,
    /// PCIe, IOMMU, NUMA placement, FI_*/NCCL_* settings. Exit 0 ok, 1 warnings, 2 failures.
    Doctor(crate::doctor::DoctorArgs),
    /// One rank of N, started by srun, mpirun or torchrun-style env: all-to-all, incast, ...
    Run(crate::ranks::RunArgs),
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?}: expected KEY=VALUE")),
    }
}

#[derive(Debug, Args)]
pub struct TopoArgs {
    /// Read an hwloc XML export instead of this machine.
    #[arg(long, value_name = "FILE")]
    pub xml: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// Flags every data command shares.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Transport backend.
    #[arg(long, value_enum, default_value_t = Backend::Efa)]
    pub backend: Backend,
    /// libfabric provider for the efa backend: efa, shm, tcp, ...
    #[arg(long, value_name = "NAME")]
    pub provider: Option<String>,
    /// NICs to use, comma separated (verbs: rxe0,rxe1; efa: libfabric domains). Loopback gives
    /// the first half to one side and the second half to the other.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Backend option for every NIC, KEY=VALUE, repeatable: passed to the backend as is, e.g.
    /// efa: write_completion=auto|delivery|transmit, mr_mode=strict, hmem=auto|on|off,
    /// fabric=efa-direct, shm=off|on, cuda_api=auto|on|off, gpu_ipc=on|off.
    #[arg(long = "nic-opt", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub nic_opts: Vec<(String, String)>,
    /// GPUs to use, e.g. 0 or 0-7 or 0,2. With host memory on a machine without GPUs, these
    /// name logical NIC groups (0-15), each with its own endpoints.
    #[arg(long, value_name = "LIST", default_value = "0")]
    pub gpus: GpuList,
    /// NICs per GPU: each GPU's endpoints, round-robined over its NIC group. Default: on a
    /// known instance type with its own NICs in use (efa provider, or verbs on ConnectX), that
    /// type's NICs per GPU from bench-cli/data/instances.toml (p5: 4, p5en: 2, p6-b200: 1);
    /// else 1.
    #[arg(long, value_name = "N")]
    pub nics_per_gpu: Option<usize>,
    /// Buffer memory.
    #[arg(long, value_enum, default_value_t = MemKind::Host)]
    pub mem: MemKind,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// More detail on stderr: NICs opened, their limits, knobs and pinned cores per run.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Give up when a transfer makes no progress for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub idle_timeout: f64,
    /// Take the NIC groups and cores per GPU from this hwloc XML export instead of this
    /// machine's live topology (a host where hwloc cannot see the devices, or simulated NICs
    /// that stand in for another machine's: ci/efa-sim.sh sets RDMA_BENCH_TOPOLOGY).
    #[arg(long, value_name = "FILE.xml", env = "RDMA_BENCH_TOPOLOGY")]
    pub topology: Option<std::path::PathBuf>,
}

/// What to run and how: the workload and the ladder's knobs.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Workload.
    #[arg(long, value_enum, default_value_t = Workload::Write)]
    pub workload: Workload,
    /// Message or page size (write: 64K, send: 64K, lat: 8, rate: 64).
    #[arg(short = 's', long = "size", value_name = "BYTES")]
    pub size: Option<Size>,
    /// A bandwidth-by-size table: e.g. 64,4K,64K,1M.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        conflicts_with = "size"
    )]
    pub sizes: Vec<Size>,
    /// Iterations: repeats of the whole page set (write, rate), messages per NIC (send),
    /// round trips (lat). With --imm-every K, write and rate count immediates: each of the
    /// N immediates comes after K passes over the page set (K WRITEs with --single-buffer).
    #[arg(short = 'n', long = "iters", value_name = "N")]
    pub iters: Option<u64>,
    /// Pages per GPU (write: 256, rate: 4096).
    #[arg(long, value_name = "N", conflicts_with = "single_buffer")]
    pub pages: Option<u64>,
    /// One buffer per side, reused by every operation, as fi_rma_bw, fi_*_bw and ib_write_bw
    /// do: write and rate post every WRITE (each with an immediate) from and into one page
    /// (`--pages 1`, `-n` counts WRITEs); send receives every message into one buffer. The
    /// default spreads the work over pages or receive slots that do not stay in cache.
    #[arg(long)]
    pub single_buffer: bool,
    /// write and rate: one immediate per K passes over the page set. With --single-buffer,
    /// one WRITE in K carries an immediate and the others are plain WRITEs, as ib_write_bw
    /// posts them (the target then handles one completion per K WRITEs). Default 1.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub imm_every: u32,
    /// Seed of the random page order and of the data pattern.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Check every received byte (on by default in loopback).
    #[arg(long, overrides_with = "no_verify")]
    pub verify: bool,
    /// Do not check received bytes.
    #[arg(long)]
    pub no_verify: bool,
    /// Latency operation.
    #[arg(long, value_enum, default_value_t = LatOp::WriteImm)]
    pub op: LatOp,
    /// Threads on the side that posts: one, or one per GPU.
    #[arg(long, value_enum, default_value_t = Threads::One)]
    pub threads: Threads,
    /// Pin each thread to a core near its GPU.
    #[arg(long)]
    pub pin: bool,
    /// Per-thread state instead of shared atomic counters.
    #[arg(long)]
    pub sharded: bool,
    /// Operations posted per loop turn (one post_writes call: FI_MORE / a verbs post list).
    /// 16 by default: on tcp every poll is a trip through the kernel, and posting one
    /// operation per poll halves the rate at 4 KiB; shm neither gains nor loses. The
    /// ladder's baseline posts one.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub batch: u32,
    /// Drain every NIC's completions, then post queued work, --batch at a time per NIC in
    /// turn, until every queue is full.
    #[arg(long)]
    pub lazy: bool,
    /// Warm-up iterations before timing (write/rate/send: 1 repeat, lat: 100).
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Use only the first NIC of each GPU's group.
    #[arg(long)]
    pub no_nic_groups: bool,
    /// Run the optimisation ladder: each stage adds one knob to the previous.
    #[arg(long, conflicts_with = "sizes")]
    pub ladder: bool,
    /// Run every stage or size R times, interleaved (the whole list once per round), and
    /// report each one's median round with the lowest and highest beside it: a step the
    /// spread covers is noise, not a step.
    #[arg(long, value_name = "R", default_value_t = 1)]
    pub rounds: u32,
}

#[derive(Debug, Args)]
pub struct LoopbackArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub work: WorkloadArgs,
    #[command(flatten)]
    pub out: crate::outputs::OutputArgs,
}

#[derive(Debug, Args)]
pub struct ServerArgs {
    #[command(flatten)]
    pub common: Common,
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:7471")]
    pub listen: String,
    /// Most client sessions served at once.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub max_sessions: usize,
    /// Largest buffer one client may ask for, per NIC.
    #[arg(long, value_name = "BYTES", default_value = "1G")]
    pub max_mem: Size,
    /// Close a session whose client sends nothing for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 120.0)]
    pub session_timeout: f64,
    /// Exit after serving this many sessions (default: serve forever).
    #[arg(long, value_name = "N")]
    pub sessions: Option<u64>,
}

#[derive(Debug, Args)]
pub struct ClientArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub work: WorkloadArgs,
    /// Server address.
    #[arg(long, value_name = "ADDR")]
    pub connect: String,
    /// Keep trying to reach the server for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub connect_timeout: f64,
    #[command(flatten)]
    pub out: crate::outputs::OutputArgs,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub work: WorkloadArgs,
    /// backend:provider pairs, e.g. efa:shm,efa:tcp,verbs:rxe0+rxe1
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "efa:shm,efa:tcp"
    )]
    pub pairs: Vec<Pair>,
    #[command(flatten)]
    pub out: crate::outputs::OutputArgs,
}
