//! Running the built `rdma-bench` with timeouts.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_rdma-bench")
}

/// A finished run.
#[derive(Debug)]
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
    /// Panic with both streams unless the run succeeded.
    pub fn expect_ok(self) -> Self {
        assert!(
            self.ok(),
            "rdma-bench failed ({:?}):\nstdout:\n{}\nstderr:\n{}",
            self.code,
            self.stdout,
            self.stderr
        );
        self
    }
    /// Panic unless the run failed with `needle` (case-insensitive) on stderr.
    pub fn expect_err(self, needle: &str) -> Self {
        assert!(
            !self.ok(),
            "rdma-bench succeeded where it should fail:\nstdout:\n{}",
            self.stdout
        );
        assert!(
            self.stderr.to_lowercase().contains(&needle.to_lowercase()),
            "stderr lacks {needle:?}:\n{}",
            self.stderr
        );
        self
    }
}

fn collect(r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(r).read_to_string(&mut s);
        s
    })
}

/// `rdma-bench ARGS` with its output piped, for a caller that sets more (its environment).
pub fn command(args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Spawn `rdma-bench ARGS`.
pub fn spawn(args: &[&str]) -> Child {
    command(args).spawn().expect("starting rdma-bench")
}

/// Wait for a spawned child, killing it (and failing) after `timeout`.
pub fn wait(mut child: Child, timeout: Duration) -> Out {
    let start = Instant::now();
    let out = collect(child.stdout.take().expect("stdout"));
    let err = collect(child.stderr.take().expect("stderr"));
    let code = loop {
        if let Some(st) = child.try_wait().expect("waiting") {
            break st.code();
        }
        if start.elapsed() > timeout {
            reap(&mut child);
            panic!(
                "rdma-bench ran past {timeout:?}; stderr:\n{}",
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out {
        code,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        elapsed: start.elapsed(),
    }
}

/// Kill a child, reap it, and remove the libfabric shm regions it can no longer remove
/// itself (`/dev/shm/<pid>:<uid>:*`): a later process given the same pid would otherwise
/// find them under its own endpoints' names.
pub fn reap(child: &mut Child) {
    #[cfg(feature = "efa")]
    let pid = child.id();
    let _ = child.kill();
    let _ = child.wait();
    #[cfg(feature = "efa")]
    transport_efa::remove_shm_regions_of(pid);
}

/// Run `rdma-bench ARGS` to completion within `timeout`.
pub fn run(args: &[&str], timeout: Duration) -> Out {
    wait(spawn(args), timeout)
}

/// A running `rdma-bench server`, killed on drop.
pub struct Server {
    child: Child,
    pub addr: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Start a server on 127.0.0.1 (a free port) with `extra` flags.
    pub fn start(extra: &[&str]) -> Server {
        let mut args = vec!["server", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let mut child = spawn(&args);
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut l) = log2.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(l)) = lines.next() {
                let _ = tx.send(l);
            }
            for _ in lines {}
        });
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(l) => l,
            Err(_) => {
                reap(&mut child);
                panic!(
                    "server printed no address; log:\n{}",
                    log.lock().map(|l| l.clone()).unwrap_or_default()
                );
            }
        };
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        Server { child, addr, log }
    }

    /// What the server wrote on stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Wait until the log contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.log().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn kill(&mut self) {
        reap(&mut self.child);
    }

    /// Wait up to `timeout` for the server to exit on its own: its exit code (`None`: still
    /// running, or killed by a signal).
    pub fn exit_code(&mut self, timeout: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Send the server `signal` (`STOP`, `CONT`, ...) with kill(1).
    pub fn signal(&self, signal: &str) {
        let st = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(st.success(), "kill -{signal} failed");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Quick settings shared by the tests: tiny transfers.
pub const SMALL: &[&str] = &["-n", "2", "--pages", "16", "-s", "4K"];

pub const T: Duration = Duration::from_secs(60);

/// A TCP port for a rendezvous (`MASTER_PORT`) that nothing holds now, below the kernel's
/// ephemeral range: a port the kernel hands to `bind(0)` (a provider's listener, another
/// test's server) may be taken between this check and the rank that binds it; one below the
/// range only by an explicit bind. Tried from a start that differs per process and call, so
/// tests running side by side pick different ones (as `ci/listening.sh`'s `free_port`).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768)
        .clamp(11000, 65535);
    let span = low - 10000;
    let k = CALLS.fetch_add(1, Ordering::Relaxed);
    let start = (std::process::id().wrapping_mul(7919) + k.wrapping_mul(104_729)) % span;
    (0..span)
        .map(|i| (10000 + (start + i) % span) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below the ephemeral range")
}
