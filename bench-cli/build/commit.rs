//! The git commit a tree at `dir` was checked out at, for the run record: `git rev-parse HEAD`
//! where `dir` is the top of a git work tree, else `unknown` (a tarball, a vendored copy
//! inside another project's repository, no git). Shared by `build.rs` and its test.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `git` in `dir`: its trimmed output, where it ran and succeeded.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !s.trim().is_empty()).then(|| s.trim().to_string())
}

/// The commit of the work tree whose top is `dir`, with the files whose change means a new
/// commit (HEAD, the branch it points at, packed refs); `("unknown", [])` where `dir` is not
/// the top of a git work tree.
pub fn commit(dir: &Path) -> (String, Vec<PathBuf>) {
    let unknown = || ("unknown".to_string(), Vec::new());
    let (Some(top), Ok(dir)) = (
        git(dir, &["rev-parse", "--show-toplevel"]),
        dir.canonicalize(),
    ) else {
        return unknown();
    };
    // Inside some other repository (a vendored copy): its commit is not this tree's.
    if Path::new(&top).canonicalize().ok().as_deref() != Some(dir.as_path()) {
        return unknown();
    }
    let Some(hash) = git(&dir, &["rev-parse", "--verify", "HEAD"]) else {
        return unknown();
    };
    if hash.len() != 40 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return unknown();
    }
    let path = |p: &str| git(&dir, &["rev-parse", "--git-path", p]).map(|x| dir.join(x));
    let mut watch: Vec<PathBuf> = ["HEAD", "packed-refs"]
        .iter()
        .filter_map(|p| path(p))
        .collect();
    if let Some(r) = git(&dir, &["symbolic-ref", "-q", "HEAD"]).and_then(|r| path(&r)) {
        // A branch not written yet as a file (packed) appears in its folder when committed to.
        watch.push(if r.exists() {
            r
        } else {
            r.parent().map(Path::to_path_buf).unwrap_or(r)
        });
    }
    (hash, watch)
}
