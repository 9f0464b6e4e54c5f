//! `rdma-bench`: see `rdma-bench --help`. The table of backends ([`backends`]), the flags
//! ([`cli`]) and their mapping onto the libraries' configs ([`app`]); everything else lives in
//! bench-core, bench-coord, bench-report and bench-doctor.

#![forbid(unsafe_code)]

mod app;
mod backends;
mod cli;

fn main() -> std::process::ExitCode {
    app::main_with(cli::parse())
}
