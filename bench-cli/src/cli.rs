//! The command line (clap derive), and the mapping from its flags to the libraries' configs.
//! Vocabulary follows perftest where it has a word: `-s` size, `-n` iterations.

use std::path::PathBuf;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};

use bench_coord::backend::Backend;
use bench_core::config::{Choice, LatOp, MemKind, Pattern, Threads, Workload};
use bench_core::plan::WorkloadSpec;
use bench_core::units::{GpuList, Size};

use crate::backends::{self, Pair};
use bench_doctor::DoctorCfg;
use bench_report::outputs::OutputSpec;

/// A flag's parser for one of bench-core's [`Choice`] sets: their names are the values it
/// takes and `--help` lists, each with its line of help.
fn choice<T: Choice>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::ALL.iter().map(|v| match v.help() {
        "" => PossibleValue::new(v.name()),
        h => PossibleValue::new(v.name()).help(h),
    }))
    .try_map(|s| T::from_name(&s).ok_or_else(|| format!("{s:?}: not one of the values listed")))
}

/// `--backend`'s parser: the table's backends (their names, and aliases that are accepted but
/// not listed), each with its line of help.
fn backend() -> impl TypedValueParser<Value = &'static Backend> {
    PossibleValuesParser::new(backends::BACKENDS.iter().map(|b| {
        let i = b.info();
        let v = PossibleValue::new(i.name).aliases(i.aliases.iter().copied());
        match i.help {
            "" => v,
            h => v.help(h),
        }
    }))
    .try_map(|s| backends::find(&s).ok_or_else(|| format!("{s:?}: not one of the values listed")))
}

/// The command line, with the help of `--provider`, `--devices`, `--nic-opt` and `compare
/// --pairs` written from the table of backends: what each built-in backend says of itself.
pub fn command() -> clap::Command {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    for sub in cmd.get_subcommands_mut() {
        let has = |c: &clap::Command, id: &str| c.get_arguments().any(|a| a.get_id() == id);
        if !has(sub, "nic_opts") {
            continue;
        }
        let mut c = std::mem::take(sub)
            .mut_arg("provider", |a| a.help(backends::provider_help()))
            .mut_arg("devices", |a| a.help(backends::devices_help()))
            .mut_arg("nic_opts", |a| {
                a.help(backends::options_help(false))
                    .long_help(backends::options_help(true))
            });
        if has(&c, "pairs") {
            c = c.mut_arg("pairs", |a| a.help(backends::pairs_help()));
        }
        *sub = c;
    }
    cmd
}

/// The command line as given, parsed against [`command`] (a usage error exits as clap's do).
pub fn parse() -> Cli {
    let m = command().get_matches();
    <Cli as clap::FromArgMatches>::from_arg_matches(&m).unwrap_or_else(|e| e.exit())
}

/// One RDMA benchmark for every backend it was built with (`--backend`), GPU or host memory,
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
    /// Check this node before a run: RDMA devices and links, the backends' libraries (and with
    /// --backend, what that one would use), GPU memory paths, PCIe, IOMMU, NUMA placement,
    /// FI_*/NCCL_* settings. Exit 0 ok, 1 warnings, 2 failures.
    Doctor(DoctorArgs),
    /// One rank of N, started by srun, mpirun or torchrun-style env: all-to-all, incast, ...
    Run(RunArgs),
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
    #[arg(long, value_parser = backend(), default_value = backends::default_name())]
    pub backend: &'static Backend,
    /// The provider, for a backend with providers (`--help` lists them: [`command`]).
    #[arg(long, value_name = "NAME")]
    pub provider: Option<String>,
    /// NICs to use, comma separated (`--help` says what each backend's are: [`command`]).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Backend option for every NIC, KEY=VALUE, repeatable (`--help` lists each backend's:
    /// [`command`]).
    #[arg(long = "nic-opt", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub nic_opts: Vec<(String, String)>,
    /// GPUs to use, e.g. 0 or 0-7 or 0,2 [default: 0]. With host memory on a machine without
    /// GPUs, these name logical NIC groups (0-15), each with its own endpoints. The server
    /// takes each client's count by default; given, it serves the first N of this list.
    #[arg(long, value_name = "LIST")]
    pub gpus: Option<GpuList>,
    /// NICs per GPU: each GPU's endpoints, round-robined over its NIC group. Default: on a
    /// known instance type with its own NICs in use (efa provider, or verbs on ConnectX), that
    /// type's NICs per GPU from bench-doctor/data/instances.toml (p5: 4, p5en: 2, p6-b200: 1);
    /// else 1. The server takes each client's by default (at most its GPUs' NIC groups).
    #[arg(long, value_name = "N")]
    pub nics_per_gpu: Option<usize>,
    /// Buffer memory [default: host]. The server takes each client's by default.
    #[arg(long, value_parser = choice::<MemKind>())]
    pub mem: Option<MemKind>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// More detail on stderr: NICs opened, their limits, knobs and pinned cores per run.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Give up when a transfer makes no progress for this many seconds [default: 10; 30 for
    /// gpu-write's steps, whose GPU-memory copies over shm are slow].
    #[arg(long, value_name = "SECS")]
    pub idle_timeout: Option<f64>,
    /// Take the NIC groups and cores per GPU from this hwloc XML export instead of this
    /// machine's live topology (a host where hwloc cannot see the devices, or simulated NICs
    /// that stand in for another machine's: ci/efa-sim.sh sets RDMA_BENCH_TOPOLOGY).
    #[arg(long, value_name = "FILE.xml", env = "RDMA_BENCH_TOPOLOGY")]
    pub topology: Option<std::path::PathBuf>,
}

impl Common {
    /// `--gpus`, or GPU 0.
    pub fn gpus(&self) -> Vec<usize> {
        self.gpus.as_ref().map_or_else(|| vec![0], |g| g.0.clone())
    }

    /// `--mem`, or host memory.
    pub fn mem(&self) -> MemKind {
        self.mem.unwrap_or(MemKind::Host)
    }
}

/// What to run and how: the workload and the ladder's knobs.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Workload.
    #[arg(long, value_parser = choice::<Workload>(), default_value = "write")]
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
    /// Start each data region this many bytes into a 4 KiB page (0-4095, host or GPU memory),
    /// on both sides: the server places its own as the client does, to place them as another
    /// tool does (ucx_perftest's heap buffers start off the page, its GPU receive buffer 512
    /// bytes in; rdma-bench's start on it by default, GPU regions where cuMemAlloc puts them).
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub buf_offset: u32,
    /// write and rate: one immediate per K passes over the page set. With --single-buffer,
    /// one WRITE in K carries an immediate and the others are plain WRITEs, as ib_write_bw
    /// posts them (the target then handles one completion per K WRITEs). Default 1.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub imm_every: u32,
    /// Seed of the random page order and of the data pattern.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Check every received byte: the default in every command (loopback, client, compare,
    /// run); kept for scripts that name it.
    #[arg(long, overrides_with = "no_verify")]
    pub verify: bool,
    /// Do not check received bytes: a pure speed run (the output says `verified no`).
    #[arg(long)]
    pub no_verify: bool,
    /// Latency operation.
    #[arg(long, value_parser = choice::<LatOp>(), default_value = "write-imm")]
    pub op: LatOp,
    /// Threads on the side that posts: one, or one per GPU.
    #[arg(long, value_parser = choice::<Threads>(), default_value = "one")]
    pub threads: Threads,
    /// gpu-write: who publishes the commands into the proxy's ring: `cpu` (a host thread) or
    /// `cuda` (GPU threads, one kernel per batch; needs a CUDA driver and NVRTC).
    #[arg(long, value_parser = ["cpu", "cuda"], default_value = "cpu")]
    pub producer: String,
    /// gpu-write with `--producer cuda`: the latency kernel pauses NS (nanosleep, up to
    /// about 1 ms) between two polls of its arrival counter, each a read across PCIe; 0
    /// spins.
    #[arg(long, value_name = "NS", default_value_t = 0)]
    pub kernel_poll_sleep: u32,
    /// gpu-write with `--producer cuda`: the latency kernel polls late: after each publish it
    /// sleeps until NS before its fastest round trip so far would end (the GPU's clock), then
    /// polls; 0 polls from the publish on. Its polls cross PCIe and slow CUDA copies.
    #[arg(long, value_name = "NS", default_value_t = 0)]
    pub kernel_poll_margin: u32,
    /// gpu-write with `--producer cuda`: how the latency kernel publishes a command:
    /// `unfenced` (its words carry their lap, no fence: the payload was in place before the
    /// launch), `release` (word 0 with st.release.sys, what a kernel that wrote the payload
    /// pays) or `fence` (__threadfence_system, then the words). Their cost is what this
    /// compares.
    #[arg(long, value_parser = ["unfenced", "release", "fence"], default_value = "unfenced")]
    pub kernel_publish: String,
    /// gpu-write: how the server answers the proxy path's WRITEs. `host` (the default): as it
    /// answers the host path's, a thread polling its endpoint, so the two figures differ in
    /// the client's initiator alone; `ring`: through its own ring and proxy (its proxy counts
    /// the immediates, a CPU echo pushes the answers), as a GPU consumer's kernel would.
    #[arg(long, value_parser = ["host", "ring"], default_value = "host")]
    pub server_echo: String,
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
    /// Operations each NIC keeps in flight at most (send and write: posted and not yet
    /// reported complete); by default the endpoint's send queue depth. For a comparison with
    /// a tool that has a window: ucx_perftest -O, the fabtests' -W, perftest's -t.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub window: u32,
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
    /// spread covers is noise, not a step. Default: 3 with --ladder, else 1. gpu-write runs
    /// each size's host and proxy steps R times side by side, alternating which goes first,
    /// and compares them round by round.
    #[arg(long, value_name = "R")]
    pub rounds: Option<u32>,
}

#[derive(Debug, Args)]
pub struct LoopbackArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub work: WorkloadArgs,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Debug, Args)]
pub struct ServerArgs {
    #[command(flatten)]
    pub common: Common,
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:7471")]
    pub listen: String,
    /// Most client sessions served at once.
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_sessions: usize,
    /// Largest buffer one client may ask for, per NIC.
    #[arg(long, value_name = "BYTES", default_value = "1G")]
    pub max_mem: Size,
    /// Close a session whose client sends nothing for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 120.0)]
    pub session_timeout: f64,
    /// Exit after serving this many sessions (default: serve forever); non-zero if any failed.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
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
    pub out: OutputArgs,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub work: WorkloadArgs,
    /// BACKEND:PROVIDER or BACKEND:DEV+DEV pairs (`--help` gives each backend's: [`command`]).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "libfabric:shm,libfabric:tcp"
    )]
    pub pairs: Vec<Pair>,
    #[command(flatten)]
    pub out: OutputArgs,
}

impl From<&WorkloadArgs> for WorkloadSpec {
    fn from(w: &WorkloadArgs) -> Self {
        WorkloadSpec {
            workload: w.workload,
            size: w.size.map(|s| s.0),
            sizes: w.sizes.iter().map(|s| s.0).collect(),
            iters: w.iters,
            pages: w.pages,
            single_buffer: w.single_buffer,
            imm_every: w.imm_every,
            seed: w.seed,
            verify: if w.no_verify {
                Some(false)
            } else {
                w.verify.then_some(true)
            },
            op: w.op,
            threads: w.threads,
            pin: w.pin,
            sharded: w.sharded,
            batch: w.batch,
            lazy: w.lazy,
            window: w.window,
            warmup: w.warmup,
            no_nic_groups: w.no_nic_groups,
            ladder: w.ladder,
            rounds: w.rounds,
        }
    }
}

/// Gate, plot and report flags.
#[derive(Debug, Clone, Default, Args)]
pub struct OutputArgs {
    /// Gate against an instance type's line rates (p5, p5e, p5en, p6-b200, p4d, cx7-400):
    /// every NIC, GPU and the node must reach its threshold (exit status 3 if one does not).
    #[arg(long, value_name = "TYPE")]
    pub expect: Option<String>,
    /// Gate: percent of line rate each NIC, GPU and the node must reach (the table's
    /// threshold with --expect, else each NIC's reported link speed).
    #[arg(long, value_name = "PCT")]
    pub min_pct: Option<f64>,
    /// Gate: Gbit/s each NIC endpoint must reach (works where no line rate is known, e.g. shm).
    #[arg(long, value_name = "GBPS")]
    pub min_gbps: Option<f64>,
    /// Draw bandwidth against size (--sizes), stage (--ladder) or pair (compare) into an SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Write one self-contained HTML page: tables, gate, plot, topology, node check.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// The hwloc XML export the report's topology section shows (default: this machine).
    #[arg(long, value_name = "FILE", requires = "report")]
    pub report_topology: Option<PathBuf>,
}

impl From<&OutputArgs> for OutputSpec {
    fn from(o: &OutputArgs) -> Self {
        OutputSpec {
            expect: o.expect.clone(),
            min_pct: o.min_pct,
            min_gbps: o.min_gbps,
            plot: o.plot.clone(),
            report: o.report.clone(),
            report_topology: o.report_topology.clone(),
            probes: backends::probes(),
            ask: transport_core::ProbeAsk::default(),
        }
    }
}

impl OutputArgs {
    /// The output flags of a run that uses `common` with `provider`: the report's node check
    /// asks the backend about what the run names, as `doctor --backend B --provider P
    /// --devices D --mem M` does.
    pub fn spec(&self, common: &Common, provider: Option<String>) -> OutputSpec {
        OutputSpec {
            ask: transport_core::ProbeAsk {
                backend: Some(common.backend.name().to_string()),
                provider,
                devices: common.devices.clone(),
                gpu_memory: common.mem() == MemKind::Cuda,
            },
            ..self.into()
        }
    }
}

/// `rdma-bench doctor` flags.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Read sysfs and procfs under DIR instead of / (a copy of another node's files, or a
    /// test fixture); libfabric, which is this process's, is then not checked.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Take the GPU/NIC/NUMA layout from an hwloc XML export instead of this machine.
    #[arg(long, value_name = "FILE")]
    pub topology: Option<PathBuf>,
    /// List the checks (id, what it checks, what to do) instead of checking this node.
    #[arg(long, conflicts_with_all = ["json", "root", "topology"])]
    pub list_checks: bool,
    /// With --list-checks: as a markdown table (README.md's).
    #[arg(long, requires = "list_checks")]
    pub markdown: bool,
    /// The backend the run will use: its library is asked about --provider, --devices and
    /// --mem (e.g. ucx: the transports UCX would use, and whether it falls back to tcp).
    #[arg(long, value_parser = backend())]
    pub backend: Option<&'static Backend>,
    /// The provider the run will name (as `run --provider`).
    #[arg(long, value_name = "NAME", requires = "backend")]
    pub provider: Option<String>,
    /// The NICs the run will name (as `run --devices`), comma separated.
    #[arg(
        long,
        value_name = "NAMES",
        value_delimiter = ',',
        requires = "backend"
    )]
    pub devices: Vec<String>,
    /// The buffer memory the run will use (as `run --mem`).
    #[arg(long, value_parser = choice::<MemKind>(), requires = "backend")]
    pub mem: Option<MemKind>,
}

impl From<&DoctorArgs> for DoctorCfg {
    fn from(a: &DoctorArgs) -> Self {
        DoctorCfg {
            json: a.json,
            root: a.root.clone(),
            topology: a.topology.clone(),
            probes: backends::probes(),
            ask: transport_core::ProbeAsk {
                backend: a.backend.map(|b| b.name().to_string()),
                provider: a.provider.clone(),
                devices: a.devices.clone(),
                gpu_memory: a.mem == Some(MemKind::Cuda),
            },
            list_checks: a.list_checks,
            markdown: a.markdown,
        }
    }
}

/// `rdma-bench run`'s flags.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub work: WorkloadArgs,
    /// Who WRITEs to whom.
    #[arg(long, value_parser = choice::<Pattern>(), default_value = "all-to-all")]
    pub pattern: Pattern,
    /// Where rank 0 listens. Default: MASTER_ADDR:MASTER_PORT, else the first node of the
    /// Slurm step (port from the job id).
    #[arg(long, value_name = "HOST:PORT")]
    pub rendezvous: Option<String>,
    /// Seconds rank 0 waits for every rank to join (and a rank for rank 0).
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub rendezvous_timeout: f64,
    /// One rank per GPU: this rank drives only GPU number LOCAL_RANK of --gpus (use when the
    /// launcher starts one rank per GPU). Without it every rank drives all of --gpus.
    #[arg(long)]
    pub gpu_per_rank: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command that opens NICs says, in its `--help`, what each built-in backend takes:
    /// its device names, its providers and every option with its values and help.
    #[test]
    fn help_says_what_each_built_backend_takes() {
        let mut cmd = command();
        let subs = ["loopback", "server", "client", "compare", "run"];
        for name in subs {
            let sub = cmd.find_subcommand_mut(name).expect(name);
            let help = sub.render_long_help().to_string();
            let short = sub.render_help().to_string();
            let short = short.split_whitespace().collect::<Vec<_>>().join(" ");
            for i in backends::built() {
                assert!(
                    help.contains(i.devices),
                    "{name}: {}'s devices\n{help}",
                    i.name
                );
                if let Some(p) = &i.provider {
                    assert!(help.contains(p.names), "{name}: {}'s providers", i.name);
                }
                for o in i.options {
                    let kv = format!("{}={}: {}", o.key, o.values, o.help);
                    assert!(help.contains(&kv), "{name}: {kv}\n{help}");
                }
                let known = i.known_options();
                assert!(short.contains(&known), "{name} -h: {known}\n{short}");
            }
        }
        let compare = cmd.find_subcommand_mut("compare").expect("compare");
        let help = compare.render_long_help().to_string();
        assert!(help.contains("libfabric:shm"), "{help}");
    }
}
