//! Print the topology: `cargo run -p topo --example topo_dump -- [--xml FILE] [--json]`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut xml = None;
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => json = true,
            "--xml" => xml = args.next(),
            other => {
                eprintln!("unknown argument {other}; usage: topo_dump [--xml FILE] [--json]");
                return ExitCode::from(2);
            }
        }
    }
    let result = match &xml {
        Some(path) => topo::from_xml(path),
        None => topo::discover(),
    };
    match result {
        Ok(t) if json => {
            println!("{}", t.to_json_pretty());
            ExitCode::SUCCESS
        }
        Ok(t) => {
            print!("{}", t.render_table());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
