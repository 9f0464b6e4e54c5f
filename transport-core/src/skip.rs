//! What a test that cannot run here says, so that a skip is never read as a pass.
//!
//! A Rust test that finds no device (no efa device, no CUDA, no RDMA NIC) returns early and
//! `cargo test` counts it as `ok`. [`note`] says so on stderr and, where
//! `RDMA_BENCH_SKIP_LOG` names a file (ci/test.sh sets it), appends one line to it:
//! `TEST<TAB>REASON<TAB>DETAIL`, so that CI's summary counts the cases that did not run, by
//! reason, beside the steps that passed.

use std::io::Write;

/// Note that the running test skips for `reason` (a short, stable phrase that groups skips:
/// "no efa device", "no CUDA device"), with `detail` (the provider's text, a path).
pub fn note(reason: &str, detail: &str) {
    note_to(
        std::env::var_os("RDMA_BENCH_SKIP_LOG").as_deref(),
        reason,
        detail,
    )
}

fn note_to(log: Option<&std::ffi::OsStr>, reason: &str, detail: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("?")
        .replace('\t', " ");
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| match s.rsplit_once('-') {
            // cargo names test binaries NAME-HASH
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
            _ => s,
        })
        .unwrap_or_default();
    let one_line = |s: &str| s.replace(['\t', '\n'], " ");
    eprintln!("SKIPPED ({reason}): {detail}");
    let Some(path) = log else {
        return;
    };
    let line = format!(
        "{bin}::{test}\t{}\t{}\n",
        one_line(reason),
        one_line(detail)
    );
    // One write of one line with O_APPEND: test threads and processes do not interleave.
    let wrote = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = wrote {
        panic!(
            "cannot note a skip in RDMA_BENCH_SKIP_LOG={}: {e}",
            std::path::Path::new(path).display()
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_skip_is_one_line_of_the_log() {
        let path = std::env::temp_dir().join(format!("skip-log-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        super::note_to(
            Some(path.as_os_str()),
            "no test device",
            "nothing\tat all\nhere",
        );
        let text = std::fs::read_to_string(&path).expect("the log");
        std::fs::remove_file(&path).unwrap();
        let fields: Vec<&str> = text.trim_end().split('\t').collect();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(
            fields[0].ends_with("::skip::tests::a_skip_is_one_line_of_the_log"),
            "{text:?}"
        );
        assert_eq!(&fields[1..], ["no test device", "nothing at all here"]);
    }
}
