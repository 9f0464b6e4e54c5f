//! The verdict: each check's [`Status`] and [`Check`], the whole [`Report`] with its exit
//! code (0 all ok, 1 warnings, 2 a failure), and the table people read ([`render`]).

use std::fmt::Write as _;

use serde::Serialize;

/// Outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Does not apply here, or cannot be read; never changes the exit status.
    Skip,
    Warn,
    Fail,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skip => "skip",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One check's verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub id: String,
    pub status: Status,
    pub summary: String,
    /// What to do, one line (absent when ok).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// The whole verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub root: String,
    /// DMI product name and vendor.
    pub product: Option<String>,
    pub vendor: Option<String>,
    /// Instance type from the table (`p5`...), where recognised.
    pub instance: Option<String>,
    pub checks: Vec<Check>,
    pub exit_code: u8,
}

impl Report {
    pub fn worst(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Ok)
    }
    pub fn get(&self, id: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.id == id)
    }
    pub fn status(&self, id: &str) -> Option<Status> {
        self.get(id).map(|c| c.status)
    }
}

pub(crate) fn exit_code(worst: Status) -> u8 {
    match worst {
        Status::Fail => 2,
        Status::Warn => 1,
        _ => 0,
    }
}

/// The table people read.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "rdma-bench doctor: {}{}",
        r.product.as_deref().unwrap_or("unknown machine"),
        r.instance
            .as_deref()
            .map(|i| format!(" (instance type {i})"))
            .unwrap_or_default()
    );
    let w = r.checks.iter().map(|c| c.id.len()).max().unwrap_or(8);
    for c in &r.checks {
        let _ = writeln!(
            out,
            "  {:<4}  {:<w$}  {}",
            c.status.label(),
            c.id,
            c.summary
        );
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "  {:<4}  {:<w$}  fix: {fix}", "", "");
        }
    }
    let count = |s: Status| r.checks.iter().filter(|c| c.status == s).count();
    let _ = writeln!(
        out,
        "{} ok, {} warning(s), {} failure(s), {} skipped: exit {}",
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Skip),
        r.exit_code
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(Status::Ok), 0);
        assert_eq!(exit_code(Status::Skip), 0);
        assert_eq!(exit_code(Status::Warn), 1);
        assert_eq!(exit_code(Status::Fail), 2);
    }
}
