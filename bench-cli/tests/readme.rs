//! Every command README.md shows, run against the built binary, so that the README cannot drift
//! from it (issue 30). The README is read at build time (`include_str!`): an edit rebuilds this
//! test.
//!
//! What counts as a command:
//! - every line of a ```sh block (backslash continuations joined, `#` comments stripped;
//!   `#SBATCH` lines are kept as Slurm directives, a `#!` line is a script's first line);
//! - every `$ ` line of a ```text sample, with the sample's `exit N` line as its exit status,
//!   and its output lines compared with the real output (numbers masked);
//! - every inline `rdma-bench ...` or `ci/...` code span in the prose (reported at its
//!   paragraph's first line).
//!
//! Each is run here (see [`SUBSTITUTIONS`] for what changes on a machine without EFA, GPUs or
//! RDMA devices), or named in [`ELSEWHERE`] with the CI step that runs it. A command that is
//! neither fails the test: a README edit that adds a command without a test goes red.
#![cfg(feature = "efa")]

mod common;
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};

use common::*;

const README: &str = include_str!("../../README.md");

/// What a README command becomes here, in one place. Applied to every `rdma-bench` command
/// (and to the `rdma-bench run` part of `srun`/`mpirun` lines) before it runs.
const SUBSTITUTIONS: &[(&str, &str, &str)] = &[
    (
        "--provider efa",
        "--provider shm",
        "no EFA here: libfabric's shm provider",
    ),
    (
        "server/client without --provider",
        "--provider shm",
        "their default provider is efa (the server does not take the client's provider)",
    ),
    (
        "--mem cuda",
        "--mem host",
        "no GPU: host memory, where --gpus 0-7 names 8 logical NIC groups (kept as typed)",
    ),
    (
        "--listen 0.0.0.0:7471",
        "--listen 127.0.0.1:0",
        "loopback, a free port; the server line is started as typed otherwise (no layout flags)",
    ),
    (
        "--connect NODE_A:7471 / PEER:7471",
        "--connect <that server's address>",
        "a client line with no server line before it starts one: `server --provider shm`",
    ),
    (
        "loopback, client, compare, run",
        "+ -n 2 --pages 4 (unless given; no --pages for --workload gpu-write)",
        "small runs; sizes as typed (the README's largest is 1M: 4 MiB per NIC and side)",
    ),
    (
        "--expect TYPE on shm",
        "exit 3, `gate failed`",
        "shm has no line rate: a p5 gate fails, as the README's own sample shows",
    ),
    (
        "rdma-bench doctor",
        "exit 0 or 1",
        "warnings depend on the machine (memlock, no RDMA device); 2 (a failure) fails",
    ),
    (
        "--backend verbs",
        "run as typed (but --mem host): exit 0, or an error that names the missing RDMA device, \
         never a usage error (exit 2); then again with --backend libfabric --provider shm, \
         which must pass and verify",
        "no RDMA device here; the rest of the line still runs",
    ),
    (
        "srun [opts] rdma-bench run ...",
        "2 processes with SLURM_PROCID, SLURM_NTASKS=2, SLURM_LOCALID=0, \
         SLURM_STEP_NODELIST=localhost, SLURM_JOB_ID (its port is free)",
        "one rank per node, as --ntasks-per-node=1; the rendezvous comes from Slurm's variables",
    ),
    (
        "mpirun [opts] -x V=X ... rdma-bench run ...",
        "2 processes with OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK} and the -x variables; \
         MASTER_ADDR=$(head -1 hosts) -> 127.0.0.1, MASTER_PORT -> a free port",
        "one rank per node (ppr:1:node); the launchers' own options are not checked here",
    ),
    ("> FILE", "stdout, checked", "nothing is written"),
    (
        "ci/main.sh ARGS",
        "rdma-bench loopback ARGS",
        "the README says ci/main.sh is `rdma-bench loopback` and takes its flags",
    ),
    ("rdma-bench COMMAND --help", "every subcommand's --help", ""),
    ("`rdma-bench doctor [--json]`", "both", ""),
    (
        "a bare `rdma-bench SUB` in prose",
        "rdma-bench SUB --help exits 0",
        "the subcommand exists",
    ),
];

/// Commands this test does not run, with the CI step that does. Matched exactly: a changed
/// command needs a look here.
const ELSEWHERE: &[(&str, &str)] = &[
    (
        "ci/main.sh",
        ".ci/run runs ci/main.sh first (release build, verified shm loopback)",
    ),
    ("ci/test.sh", ".ci/run runs ci/test.sh after ci/main.sh"),
    (
        "ci/compare-ref.sh --rounds 6",
        "ci/test.sh's step `ci/compare-ref.sh --quick` runs every row (one round)",
    ),
    (
        "ci/compare-ref.sh",
        "ci/test.sh's step `ci/compare-ref.sh --quick`",
    ),
    (
        "ci/setup.sh",
        "ci/main.sh and ci/test.sh source it on every CI run (.ci/run)",
    ),
    (
        "cargo build --release -p bench-cli",
        "ci/main.sh builds the release binary (with --features ucx); cargo test builds the \
         binary this test runs",
    ),
    (
        "rdma-bench loopback --workload gpu-write --producer cuda",
        "GPU threads: the GPU host's `STEPS=proxy ci/gpu-host.sh run` (not CI: no GPU); \
         bench-cli/tests/gpu_write.rs checks that a build without CUDA refuses it by name",
    ),
    (
        "ci/gpu-host.sh pack",
        "the GPU host's runs, by hand (docs/testing.md); not CI: no GPU",
    ),
    (
        "ci/gpu-efa-sim.sh run",
        "the GPU host, by hand (docs/efa-sim.md); CI runs the simulator's GPU checks against a \
         stand-in libcuda (efa-sim/gpu.sh)",
    ),
    (
        "#SBATCH --nodes=16 --ntasks-per-node=1 --exclusive",
        "a Slurm directive: ci/launchers-test.sh runs srun on a one-node cluster; here the \
         srun line's ranks run one per (simulated) node",
    ),
];

/// Backends behind a cargo feature that is off by default: with the feature, their README
/// lines run like any other; without it (a plain `cargo test -p bench-cli`), the binary must
/// refuse them with this error, and the test says they did not run. ci/test.sh's host tests
/// build with `--features bench-cli/ucx`, so CI runs them.
const FEATURES: &[(&str, bool, &str)] = &[(
    "--backend ucx",
    cfg!(feature = "ucx"),
    "this rdma-bench was built without the `ucx` feature",
)];

/// A README command and where it came from.
#[derive(Debug, Clone)]
struct Cmd {
    line: usize,
    text: String,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    /// A line of a ```sh block.
    Sh,
    /// A `$ ` line of a ```text sample: its exit line, its output lines.
    Sample { exit: i32, body: Vec<String> },
    /// An inline code span in the prose.
    Inline,
}

/// The README's commands, in order.
fn commands(readme: &str) -> Vec<Cmd> {
    let mut out = Vec::new();
    let lines: Vec<&str> = readme.lines().collect();
    let mut i = 0;
    let mut prose = String::new();
    let mut prose_line = 1;
    let flush_prose = |prose: &mut String, at: usize, out: &mut Vec<Cmd>| {
        for (k, span) in prose.split('`').enumerate() {
            let span = span.trim();
            if k % 2 == 1
                && ["rdma-bench", "ci/", "srun", "mpirun", "sbatch", "cargo"]
                    .iter()
                    .any(|p| span.starts_with(p))
            {
                out.push(Cmd {
                    line: at,
                    text: span.split_whitespace().collect::<Vec<_>>().join(" "),
                    kind: Kind::Inline,
                });
            }
        }
        prose.clear();
    };
    while i < lines.len() {
        let l = lines[i];
        if let Some(lang) = l.strip_prefix("```") {
            flush_prose(&mut prose, prose_line, &mut out);
            let start = i + 1;
            let mut body = Vec::new();
            i += 1;
            while i < lines.len() && !lines[i].starts_with("```") {
                body.push((i + 1, lines[i]));
                i += 1;
            }
            i += 1;
            match lang.trim() {
                "sh" | "bash" | "shell" | "console" => {
                    let mut joined: Vec<(usize, String)> = Vec::new();
                    let mut cont = false;
                    for (n, b) in body {
                        if cont {
                            let last = joined.last_mut().expect("a continued line");
                            last.1.push(' ');
                            last.1.push_str(b.trim());
                        } else {
                            joined.push((n, b.trim().to_string()));
                        }
                        let last = joined.last_mut().expect("a line");
                        cont = last.1.ends_with('\\');
                        if cont {
                            last.1.pop();
                        }
                    }
                    for (n, l) in joined {
                        let l = if l.starts_with("#SBATCH") {
                            l
                        } else if l.starts_with('#') {
                            // A comment, or a script's `#!` line.
                            continue;
                        } else {
                            match l.find(" #") {
                                Some(c) => l[..c].to_string(),
                                None => l,
                            }
                        };
                        let l = l.split_whitespace().collect::<Vec<_>>().join(" ");
                        if !l.is_empty() {
                            out.push(Cmd {
                                line: n,
                                text: l,
                                kind: Kind::Sh,
                            });
                        }
                    }
                }
                "text" => {
                    let mut cur: Option<(usize, String, Vec<String>)> = None;
                    let mut exit = 0;
                    for (n, b) in body {
                        if let Some(c) = b.strip_prefix("$ ") {
                            if let Some((n0, t, body)) = cur.take() {
                                out.push(Cmd {
                                    line: n0,
                                    text: t,
                                    kind: Kind::Sample { exit, body },
                                });
                            }
                            exit = 0;
                            cur = Some((n, c.trim().to_string(), Vec::new()));
                        } else if let Some(e) = b.strip_prefix("exit ") {
                            exit = e.trim().parse().unwrap_or_else(|_| {
                                panic!("README line {n}: `exit {e}` is not a number")
                            });
                        } else if let Some((_, _, body)) = cur.as_mut() {
                            body.push(b.to_string());
                        }
                    }
                    if let Some((n0, t, body)) = cur.take() {
                        out.push(Cmd {
                            line: n0,
                            text: t,
                            kind: Kind::Sample { exit, body },
                        });
                    }
                }
                other => panic!(
                    "README line {start}: a ```{other} block: this test reads sh and text \
                     blocks only; say in tests/readme.rs what the new kind holds"
                ),
            }
            prose_line = i + 1;
        } else {
            if l.trim().is_empty() {
                flush_prose(&mut prose, prose_line, &mut out);
                prose_line = i + 2;
            } else {
                prose.push(' ');
                prose.push_str(l);
            }
            i += 1;
        }
    }
    flush_prose(&mut prose, prose_line, &mut out);
    out
}

/// Split a command into words: whitespace, except inside `$( )`.
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0;
    let mut prev = ' ';
    for ch in s.chars() {
        match ch {
            '(' if prev == '$' => depth += 1,
            ')' if depth > 0 => depth -= 1,
            c if c.is_whitespace() && depth == 0 => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                prev = ch;
                continue;
            }
            _ => {}
        }
        cur.push(ch);
        prev = ch;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// A free port in 20000..40000, the range Slurm's job id maps to (`20000 + id % 20000`).
fn free_slurm_port() -> u16 {
    let base = 20000 + (std::process::id() % 19000) as u16;
    (0..1000)
        .map(|k| base + k)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port in 20000..40000")
}

/// A command of the binary, ready to spawn, with no launcher variables from the caller's
/// environment and traffic kept on loopback.
fn bench(args: &[String]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("FI_TCP_IFACE", "lo");
    for (k, _) in std::env::vars() {
        if k.starts_with("SLURM_")
            || k.starts_with("OMPI_")
            || k.starts_with("PMI_")
            || [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
            ]
            .contains(&k.as_str())
        {
            c.env_remove(k);
        }
    }
    c
}

fn start(c: &mut Command) -> Child {
    c.spawn().expect("starting rdma-bench")
}

/// The value of `flag` in `args`.
fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.as_str())
}

fn set(args: &mut Vec<String>, flag: &str, v: &str) {
    match args.iter().position(|a| a == flag) {
        Some(i) if i + 1 < args.len() => args[i + 1] = v.to_string(),
        _ => {
            args.push(flag.into());
            args.push(v.into());
        }
    }
}

/// [`SUBSTITUTIONS`] on the arguments after `rdma-bench`; `connect` is the server to use.
/// Returns the arguments and where stdout was redirected to (ignored: stdout is captured).
fn substitute(mut a: Vec<String>, connect: Option<&str>) -> Vec<String> {
    if let Some(i) = a.iter().position(|w| w == ">") {
        a.truncate(i);
    }
    let sub = a.first().cloned().unwrap_or_default();
    if value(&a, "--provider") == Some("efa") {
        set(&mut a, "--provider", "shm");
    }
    let libfabric = value(&a, "--backend").is_none_or(|b| b == "libfabric" || b == "efa");
    if (sub == "server" || sub == "client") && libfabric && value(&a, "--provider").is_none() {
        set(&mut a, "--provider", "shm");
    }
    if value(&a, "--mem") == Some("cuda") {
        set(&mut a, "--mem", "host");
    }
    if sub == "server" {
        set(&mut a, "--listen", "127.0.0.1:0");
    }
    if let (Some(c), Some(addr)) = (value(&a, "--connect"), connect) {
        assert!(
            c.ends_with(":7471"),
            "--connect {c}: the README's recipe uses port 7471"
        );
        set(&mut a, "--connect", addr);
    }
    if ["loopback", "client", "compare", "run"].contains(&sub.as_str()) {
        if value(&a, "-n").is_none() && value(&a, "--iters").is_none() {
            a.extend(["-n".into(), "2".into()]);
        }
        // gpu-write has no pages (its own buffers); it refuses the flag by name
        if value(&a, "--pages").is_none() && value(&a, "--workload") != Some("gpu-write") {
            a.extend(["--pages".into(), "4".into()]);
        }
    }
    a
}

/// Numbers masked, whitespace collapsed: a sample line as a pattern.
fn mask(l: &str) -> String {
    let mut s = String::new();
    let mut in_num = false;
    for ch in l.chars() {
        if ch.is_ascii_digit() || (in_num && ch == '.') {
            if !in_num {
                s.push('#');
            }
            in_num = true;
        } else {
            in_num = false;
            s.push(ch);
        }
    }
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn is_usage_error(o: &Out) -> bool {
    o.code == Some(2) && o.stderr.starts_with("error:") && o.stderr.contains("try '--help'")
}

fn show(c: &Cmd, args: &[String], o: &Out) -> String {
    format!(
        "README line {} `{}`\n  ran: rdma-bench {}\n  exit {:?}\nstdout:\n{}\nstderr:\n{}",
        c.line,
        c.text,
        args.join(" "),
        o.code,
        o.stdout,
        o.stderr
    )
}

/// A run that moved bytes said they were verified.
fn assert_verified(c: &Cmd, args: &[String], o: &Out) {
    let ok = if args.iter().any(|a| a == "--json") {
        let v = o.json();
        v["verified"] == true
    } else {
        o.stdout.contains("every byte verified")
            || (args[0] == "compare"
                && o.stdout
                    .lines()
                    .skip(1)
                    .all(|l| l.trim_end().ends_with("yes")))
    };
    assert!(ok, "not verified: {}", show(c, args, o));
}

struct State {
    server: Option<Server>,
    ran: BTreeMap<&'static str, usize>,
}

impl State {
    fn server(&mut self) -> String {
        self.server
            .get_or_insert_with(|| Server::start(&["--provider", "shm"]))
            .addr
            .clone()
    }
}

/// Run one `rdma-bench` command line (the words after `rdma-bench`).
fn run_bench(st: &mut State, c: &Cmd, typed: Vec<String>) {
    let sub = typed.first().cloned().unwrap_or_default();
    if sub == "server" {
        let a = substitute(typed, None);
        let extra: Vec<&str> = a
            .iter()
            .skip(1)
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .chunks(2)
            .filter(|p| p[0] != "--listen")
            .flatten()
            .copied()
            .collect();
        st.server = Some(Server::start(&extra));
        *st.ran.entry("server").or_default() += 1;
        return;
    }
    if value(&typed, "--backend") == Some("verbs") {
        return run_verbs(st, c, typed);
    }
    let connect = (sub == "client").then(|| st.server());
    let a = substitute(typed.clone(), connect.as_deref());
    let o = wait(start(&mut bench(&a)), T);
    let joined = format!(" {} ", typed.join(" "));
    if let Some((what, _, err)) = FEATURES
        .iter()
        .find(|(what, built, _)| !built && joined.contains(&format!(" {what} ")))
    {
        assert!(
            o.code == Some(1) && o.stderr.contains(err),
            "`{what}` in a build without its feature: {}",
            show(c, &a, &o)
        );
        eprintln!(
            "README line {}: `{}`: NOT RUN: {err} (cargo test --features bench-cli/ucx runs it, \
             as ci/test.sh does)",
            c.line, c.text
        );
        *st.ran.entry("not built").or_default() += 1;
        return;
    }
    let sample_exit = match &c.kind {
        Kind::Sample { exit, .. } => Some(*exit),
        _ => None,
    };
    if sub == "doctor" {
        assert!(
            matches!(o.code, Some(0) | Some(1)),
            "doctor: 0 or 1 (warnings): {}",
            show(c, &a, &o)
        );
        *st.ran.entry("doctor").or_default() += 1;
        return;
    }
    let gate = value(&a, "--expect").is_some();
    let want = sample_exit.unwrap_or(if gate { 3 } else { 0 });
    assert_eq!(o.code, Some(want), "{}", show(c, &a, &o));
    if gate {
        assert!(o.stderr.contains("gate failed"), "{}", show(c, &a, &o));
    }
    let workload = ["loopback", "client", "compare"].contains(&sub.as_str());
    if workload {
        assert_verified(c, &a, &o);
    }
    if let Kind::Sample { body, .. } = &c.kind {
        let got: Vec<String> = o.stdout.lines().chain(o.stderr.lines()).map(mask).collect();
        for want in body.iter().filter(|l| !l.contains("...")) {
            assert!(
                got.contains(&mask(want)),
                "the sample's line {want:?} is not in the output: {}",
                show(c, &a, &o)
            );
        }
        *st.ran.entry("sample").or_default() += 1;
    }
    *st.ran.entry("rdma-bench").or_default() += 1;
}

/// `--backend verbs`: as typed (no RDMA device here: its error, not a usage error), then the
/// same line over libfabric's shm, which must pass.
fn run_verbs(st: &mut State, c: &Cmd, typed: Vec<String>) {
    let sub = typed[0].clone();
    let a = substitute(typed.clone(), None);
    if sub == "run" {
        let outs = ranks(&a, &[], Launcher::Torchrun);
        for o in &outs {
            verbs_outcome(c, &a, o);
        }
    } else {
        let connect = (sub == "client").then(|| st.server());
        let a = substitute(typed.clone(), connect.as_deref());
        verbs_outcome(c, &a, &wait(start(&mut bench(&a)), T));
    }
    *st.ran.entry("verbs as typed").or_default() += 1;
}

fn verbs_outcome(c: &Cmd, a: &[String], o: &Out) {
    assert!(!is_usage_error(o), "a usage error: {}", show(c, a, o));
    assert!(
        o.ok() || (o.stderr.contains("verbs") && o.stderr.contains("RDMA")),
        "neither a run nor the missing RDMA device: {}",
        show(c, a, o)
    );
}

#[derive(Clone, Copy, Debug)]
enum Launcher {
    Slurm,
    OpenMpi,
    Torchrun,
}

/// Two ranks of `rdma-bench ARGS` with `launcher`'s variables (plus `vars`), one per
/// simulated node.
fn ranks(args: &[String], vars: &[(String, String)], launcher: Launcher) -> Vec<Out> {
    let port = match launcher {
        Launcher::Slurm => free_slurm_port(),
        _ => free_port(),
    };
    let children: Vec<Child> = (0..2)
        .map(|r| {
            let mut c = bench(args);
            let r = r.to_string();
            match launcher {
                Launcher::Slurm => c
                    .env("SLURM_PROCID", &r)
                    .env("SLURM_NTASKS", "2")
                    .env("SLURM_LOCALID", "0")
                    .env("SLURM_STEP_NODELIST", "localhost")
                    .env("SLURM_JOB_ID", (port - 20000).to_string()),
                Launcher::OpenMpi => c
                    .env("OMPI_COMM_WORLD_RANK", &r)
                    .env("OMPI_COMM_WORLD_SIZE", "2")
                    .env("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
                Launcher::Torchrun => c
                    .env("RANK", &r)
                    .env("WORLD_SIZE", "2")
                    .env("LOCAL_RANK", "0")
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string()),
            };
            for (k, v) in vars {
                let v = match k.as_str() {
                    "MASTER_ADDR" => "127.0.0.1".to_string(),
                    "MASTER_PORT" => port.to_string(),
                    _ => v.clone(),
                };
                c.env(k, v);
            }
            start(&mut c)
        })
        .collect();
    children.into_iter().map(|ch| wait(ch, T)).collect()
}

/// `srun [OPTS] rdma-bench run ...` or `mpirun [OPTS] rdma-bench run ...`.
fn run_launched(st: &mut State, c: &Cmd, w: &[String]) {
    let launcher = match w[0].as_str() {
        "srun" => Launcher::Slurm,
        "mpirun" => Launcher::OpenMpi,
        other => panic!("{other}"),
    };
    let at = w
        .iter()
        .position(|x| x == "rdma-bench")
        .unwrap_or_else(|| panic!("README line {}: no rdma-bench in `{}`", c.line, c.text));
    let mut vars = Vec::new();
    for p in w[..at].windows(2) {
        if p[0] == "-x" {
            let (k, v) = p[1].split_once('=').unwrap_or((&p[1], ""));
            vars.push((k.to_string(), v.to_string()));
        }
    }
    let typed: Vec<String> = w[at + 1..].to_vec();
    assert_eq!(
        typed.first().map(|s| s.as_str()),
        Some("run"),
        "README line {}: a launcher starts `rdma-bench run`",
        c.line
    );
    if value(&typed, "--backend") == Some("verbs") {
        // As typed, then over libfabric's shm below.
        let a = substitute(typed.clone(), None);
        for o in ranks(&a, &vars, launcher) {
            verbs_outcome(c, &a, &o);
        }
        *st.ran.entry("verbs as typed").or_default() += 1;
    }
    let mut a = substitute(typed, None);
    if value(&a, "--backend") == Some("verbs") {
        set(&mut a, "--backend", "libfabric");
        set(&mut a, "--provider", "shm");
    }
    let outs = ranks(&a, &vars, launcher);
    for o in &outs {
        assert_eq!(o.code, Some(0), "{launcher:?} rank: {}", show(c, &a, o));
    }
    // Rank 0 prints the job's table.
    let o = &outs[0];
    if a.iter().any(|x| x == "--json") {
        let v = o.json();
        assert_eq!(v["verified"], true, "{}", show(c, &a, o));
        assert_eq!(v["world"], 2, "{}", show(c, &a, o));
        let want = match launcher {
            Launcher::Slurm => "slurm",
            Launcher::OpenMpi => "openmpi",
            Launcher::Torchrun => "torchrun",
        };
        assert!(
            v["launcher"]
                .as_str()
                .is_some_and(|l| l.to_lowercase().replace(' ', "") == want),
            "{launcher:?}: {}",
            show(c, &a, o)
        );
    } else {
        assert!(
            o.stdout.contains("every byte verified") && o.stdout.contains("2 ranks"),
            "{}",
            show(c, &a, o)
        );
    }
    *st.ran.entry("launched ranks").or_default() += 1;
}

/// Run (or place) one README command.
fn run_cmd(st: &mut State, c: &Cmd) {
    if let Some((_, step)) = ELSEWHERE.iter().find(|(t, _)| *t == c.text) {
        eprintln!(
            "README line {}: `{}`: run elsewhere: {step}",
            c.line, c.text
        );
        *st.ran.entry("elsewhere").or_default() += 1;
        return;
    }
    let w = words(&c.text);
    match w[0].as_str() {
        "rdma-bench" if w.len() == 1 => {
            // The binary named in prose: its help.
            let o = wait(start(&mut bench(&["--help".into()])), T);
            assert!(o.ok(), "{}", show(c, &["--help".into()], &o));
        }
        "rdma-bench" if w[1] == "COMMAND" => {
            let subs = [
                "topo", "loopback", "server", "client", "compare", "doctor", "run",
            ];
            for s in subs {
                let mut a: Vec<String> = vec![s.into()];
                a.extend(w[2..].iter().cloned());
                let o = wait(start(&mut bench(&a)), T);
                assert!(o.ok(), "{}", show(c, &a, &o));
            }
        }
        "rdma-bench" if w.iter().any(|x| x.starts_with('[')) => {
            // A synopsis: `rdma-bench doctor [--json]` is both commands.
            let plain: Vec<String> = w.iter().filter(|x| !x.starts_with('[')).cloned().collect();
            let full: Vec<String> = w
                .iter()
                .map(|x| x.trim_matches(|ch| ch == '[' || ch == ']').to_string())
                .collect();
            run_bench(st, c, plain[1..].to_vec());
            run_bench(st, c, full[1..].to_vec());
        }
        "rdma-bench"
            if matches!(c.kind, Kind::Inline) && w.len() == 2 && !w[1].starts_with('-') =>
        {
            // A subcommand named in prose (`rdma-bench run`): it exists.
            let a = vec![w[1].clone(), "--help".into()];
            let o = wait(start(&mut bench(&a)), T);
            assert!(o.ok(), "{}", show(c, &a, &o));
        }
        "rdma-bench" => run_bench(st, c, w[1..].to_vec()),
        "ci/main.sh" => {
            let mut a = vec!["loopback".to_string()];
            a.extend(w[1..].iter().cloned());
            run_bench(st, c, a);
        }
        "srun" | "mpirun" => run_launched(st, c, &w),
        _ => panic!(
            "README line {}: `{}` is run by no test: run it in bench-cli/tests/readme.rs, or \
             name the CI step that runs it in ELSEWHERE",
            c.line, c.text
        ),
    }
    *st.ran.entry("commands").or_default() += 1;
}

#[test]
fn every_readme_command_runs() {
    let cmds = commands(README);
    for (from, to, why) in SUBSTITUTIONS {
        eprintln!("substitution: {from} -> {to} ({why})");
    }
    let mut st = State {
        server: None,
        ran: BTreeMap::new(),
    };
    for c in &cmds {
        let t = std::time::Instant::now();
        run_cmd(&mut st, c);
        eprintln!(
            "README line {}: `{}`: ok in {:.1} s",
            c.line,
            c.text,
            t.elapsed().as_secs_f64()
        );
    }
    if let Some(mut s) = st.server.take() {
        assert!(s.alive(), "the server exited:\n{}", s.log());
    }
    eprintln!("{} README commands: {:?}", cmds.len(), st.ran);
    // The recipes are there and ran: the two-node pair, the gate, Slurm's and Open MPI's.
    for (what, n) in [
        ("server", 1),
        ("launched ranks", 2),
        ("verbs as typed", 1),
        ("sample", 2),
        ("elsewhere", 3),
    ] {
        assert!(
            st.ran.get(what).copied().unwrap_or(0) >= n,
            "{what}: fewer than {n} ran: {:?}",
            st.ran
        );
    }
}

/// The parser finds what the README shows: continuations joined, comments stripped, directives
/// kept, samples with their exit status, spans across a line break.
#[test]
fn the_parser_reads_blocks_samples_and_spans() {
    let md = "intro `rdma-bench loopback --sizes 4K,\n64K` and `other`\n\n\
              ```sh\n#!/bin/bash\n#SBATCH --nodes=2\nsrun rdma-bench run \\\n    --json > a.json  # note\n\
              rdma-bench topo   # GPUs\n```\n\n\
              ```text\n$ rdma-bench loopback -s 4K\nrow 1\nexit 3\n```\n";
    let c = commands(md);
    let t: Vec<&str> = c.iter().map(|c| c.text.as_str()).collect();
    assert_eq!(
        t,
        [
            "rdma-bench loopback --sizes 4K, 64K",
            "#SBATCH --nodes=2",
            "srun rdma-bench run --json > a.json",
            "rdma-bench topo",
            "rdma-bench loopback -s 4K",
        ]
    );
    match &c[4].kind {
        Kind::Sample { exit, body } => {
            assert_eq!(*exit, 3);
            assert_eq!(body, &["row 1".to_string()]);
        }
        k => panic!("{k:?}"),
    }
    assert_eq!(
        words("-x A=$(head -1 hosts) -x B=2"),
        ["-x", "A=$(head -1 hosts)", "-x", "B=2"]
    );
    assert_eq!(mask("  4K   131072  0.0001  8.34  -"), "#K # # # -");
}
