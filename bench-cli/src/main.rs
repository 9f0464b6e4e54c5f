//! `rdma-bench`: see `rdma-bench --help`.

#![forbid(unsafe_code)]

use clap::Parser;

fn main() -> std::process::ExitCode {
    bench_cli::app::main_with(bench_cli::cli::Cli::parse())
}
