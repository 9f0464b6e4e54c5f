//! The progress line (indicatif) on stderr for runs longer than two seconds: only on a
//! terminal, never with `--json`.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Shown after this long.
const DELAY: Duration = Duration::from_secs(2);

/// One run's progress line.
pub struct Progress {
    bar: Option<ProgressBar>,
    start: Instant,
    shown: bool,
    what: String,
}

impl Progress {
    /// A line labelled `what`; silent with `json` or when stderr is not a terminal.
    pub fn new(what: impl Into<String>, json: bool) -> Self {
        let enabled = !json && std::io::stderr().is_terminal();
        Progress {
            bar: enabled.then(|| ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())),
            start: Instant::now(),
            shown: false,
            what: what.into(),
        }
    }

    /// Whether a line will be drawn (a terminal, no `--json`).
    pub fn enabled(&self) -> bool {
        self.bar.is_some()
    }

    /// Report `done` of `total`; the line appears once the run is two seconds old and is
    /// redrawn at most twice a second.
    pub fn update(&mut self, done: u64, total: u64) {
        let Some(bar) = &self.bar else { return };
        if !self.shown {
            if self.start.elapsed() < DELAY {
                return;
            }
            let style = ProgressStyle::with_template(
                "{msg}: [{bar:30}] {percent:>3}% ({pos}/{len}) {elapsed}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_message(self.what.clone());
            bar.set_draw_target(ProgressDrawTarget::stderr_with_hz(2));
            self.shown = true;
        }
        bar.set_length(total);
        bar.set_position(done);
    }

    /// Clear the line if one was drawn.
    pub fn finish(&mut self) {
        if let (Some(bar), true) = (&self.bar, self.shown) {
            bar.finish_and_clear();
            self.shown = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_with_json() {
        let mut p = Progress::new("write 64K", true);
        assert!(!p.enabled());
        p.update(1, 2);
        p.finish();
    }
}
