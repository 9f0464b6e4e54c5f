//! hwloc reads XML with libxml2 where Debian's `libhwloc-plugins` is installed and with a
//! built-in minimal parser where it is not (a `--no-install-recommends` install, a fresh
//! root). Every fixture and every real dump must load the same way with both.
//!
//! `HWLOC_LIBXML_IMPORT=0` forces the built-in parser. hwloc reads it when a topology is
//! loaded, so the forced run happens in a child process (this test binary again, running
//! only [`summary_child`]); the parent compares the child's summary with its own, made with
//! hwloc's default choice. CI runs this suite with and without `libhwloc-plugins`.

use std::path::{Path, PathBuf};
use std::process::Command;

const CHILD_ENV: &str = "TOPO_PARSERS_CHILD";

/// The fixtures, then the real dumps in `../shared/topologies/hwloc` when present.
fn inputs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in [
        root.join("tests/fixtures"),
        root.join("../../shared/topologies/hwloc"),
    ] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "xml"))
            .collect();
        files.sort();
        out.extend(files);
    }
    out
}

/// One line per input: its name and the grouping as JSON, or the error.
fn summary() -> String {
    let mut out = String::new();
    for path in inputs() {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let line = match topo::from_xml(&path) {
            Ok(t) => serde_json::to_string(&t).expect("a topology serializes"),
            Err(e) => format!("error: {e}"),
        };
        out.push_str(&format!("{name}\t{line}\n"));
    }
    out
}

fn libxml_plugin_present() -> bool {
    ["/usr/lib/x86_64-linux-gnu/hwloc", "/usr/lib/hwloc"]
        .iter()
        .any(|d| Path::new(d).join("hwloc_xml_libxml.so").exists())
}

/// Run by the parent test only (`--ignored`): print the summary between markers.
#[test]
#[ignore = "helper of builtin_parser_reads_what_the_default_reads, run in a child process"]
fn summary_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    print!("<<<SUMMARY\n{}SUMMARY>>>\n", summary());
}

#[test]
fn builtin_parser_reads_what_the_default_reads() {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--ignored", "--exact", "summary_child", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD_ENV, "1")
        .env("HWLOC_LIBXML_IMPORT", "0")
        .output()
        .expect("running the child test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let child = stdout
        .split_once("<<<SUMMARY\n")
        .and_then(|(_, rest)| rest.split_once("SUMMARY>>>"))
        .map(|(s, _)| s.to_string())
        .expect("the child printed its summary");
    let own = summary();
    println!(
        "default parser: {}; {} inputs",
        if libxml_plugin_present() {
            "libxml2 (libhwloc-plugins installed)"
        } else {
            "built-in (no libhwloc-plugins)"
        },
        own.lines().count()
    );
    for (a, b) in own.lines().zip(child.lines()) {
        assert_eq!(a, b, "default parser vs HWLOC_LIBXML_IMPORT=0");
    }
    assert_eq!(own.lines().count(), child.lines().count());
    // Every hwloc 1.x/2.x input loads; only format 3.0 exports are refused, with a reason.
    for line in own.lines() {
        let (name, result) = line.split_once('\t').expect("name<TAB>result");
        if result.starts_with("error:") {
            assert!(
                result.contains("version 3"),
                "{name} failed to load: {result}"
            );
        }
    }
}
