//! The progress line (indicatif) on stderr for runs longer than two seconds: only on a
//! terminal, never with `--json`.
//!
//! The measuring thread only stores two counters ([`Progress::update`]): a thread of the
//! line's own draws it. indicatif's bar takes a lock on every update and, when it redraws,
//! builds the line, asks the terminal's width and writes to stderr; inside a timed loop that
//! would land in the next operation's time.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Shown after this long.
const DELAY: Duration = Duration::from_secs(2);
/// How often the drawing thread reads the counters and redraws the line.
const TICK: Duration = Duration::from_millis(500);

/// One run's progress line.
pub struct Progress {
    /// What the measuring thread writes and the drawing thread reads; `None`: silent.
    counts: Option<Arc<Counts>>,
    drawer: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Counts {
    done: AtomicU64,
    total: AtomicU64,
    stop: AtomicBool,
}

impl Progress {
    /// A line labelled `what`; silent with `json` or when stderr is not a terminal.
    pub fn new(what: impl Into<String>, json: bool) -> Self {
        if json || !std::io::stderr().is_terminal() {
            return Self::silent();
        }
        Self::drawn(what.into(), ProgressDrawTarget::stderr_with_hz(2), DELAY)
    }

    fn silent() -> Self {
        Progress {
            counts: None,
            drawer: None,
        }
    }

    /// A line drawn into `target` by a thread of its own once `delay` passed (silent if that
    /// thread cannot start).
    fn drawn(what: String, target: ProgressDrawTarget, delay: Duration) -> Self {
        let counts = Arc::new(Counts::default());
        let c = Arc::clone(&counts);
        let start = Instant::now();
        let drawer = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || draw(&c, what, target, start + delay));
        match drawer {
            Ok(h) => Progress {
                counts: Some(counts),
                drawer: Some(h),
            },
            Err(_) => Self::silent(),
        }
    }

    /// Whether a line will be drawn (a terminal, no `--json`).
    pub fn enabled(&self) -> bool {
        self.counts.is_some()
    }

    /// Report `done` of `total`: two relaxed stores, no lock, no call into indicatif.
    #[inline]
    pub fn update(&mut self, done: u64, total: u64) {
        if let Some(c) = &self.counts {
            c.total.store(total, Ordering::Relaxed);
            c.done.store(done, Ordering::Relaxed);
        }
    }

    /// Clear the line if one was drawn (waits for the drawing thread to end).
    pub fn finish(&mut self) {
        if let (Some(c), Some(h)) = (&self.counts, self.drawer.take()) {
            c.stop.store(true, Ordering::Release);
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

/// The drawing thread: from `show` on, the bar follows the counters every [`TICK`] until
/// asked to stop, then clears it.
fn draw(c: &Counts, what: String, target: ProgressDrawTarget, show: Instant) {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    let mut target = Some(target);
    let mut shown = false;
    while !c.stop.load(Ordering::Acquire) {
        std::thread::park_timeout(TICK);
        let total = c.total.load(Ordering::Relaxed);
        if !shown {
            if total == 0 || Instant::now() < show || c.stop.load(Ordering::Acquire) {
                continue;
            }
            let style = ProgressStyle::with_template(
                "{msg}: [{bar:30}] {percent:>3}% ({pos}/{len}) {elapsed}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_message(what.clone());
            if let Some(t) = target.take() {
                bar.set_draw_target(t);
            }
            shown = true;
        }
        bar.set_length(total);
        bar.set_position(c.done.load(Ordering::Relaxed));
    }
    if shown {
        bar.finish_and_clear();
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
    use indicatif::TermLike;
    use std::sync::Mutex;

    /// A terminal that keeps what is written to it.
    #[derive(Debug, Default, Clone)]
    struct Screen(Arc<Mutex<String>>);

    impl Screen {
        fn text(&self) -> String {
            self.0.lock().map(|s| s.clone()).unwrap_or_default()
        }
        fn put(&self, s: &str) -> std::io::Result<()> {
            if let Ok(mut t) = self.0.lock() {
                t.push_str(s);
            }
            Ok(())
        }
    }

    impl TermLike for Screen {
        fn width(&self) -> u16 {
            100
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.put(s)?;
            self.put("\n")
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.put(s)
        }
        fn clear_line(&self) -> std::io::Result<()> {
            self.put("<clear>")
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line(delay: Duration) -> (Progress, Screen) {
        let screen = Screen::default();
        let target = ProgressDrawTarget::term_like(Box::new(screen.clone()));
        (Progress::drawn("write 64K".into(), target, delay), screen)
    }

    #[test]
    fn silent_with_json() {
        let mut p = Progress::new("write 64K", true);
        assert!(!p.enabled());
        p.update(1, 2);
        p.finish();
    }

    /// The counters the measuring thread stores reach the line through the drawing thread,
    /// and finishing clears it.
    #[test]
    fn the_line_follows_the_counters() {
        let (mut p, screen) = line(Duration::ZERO);
        assert!(p.enabled());
        p.update(5, 10);
        let start = Instant::now();
        while !screen.text().contains("(5/10)") {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{:?}",
                screen.text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(screen.text().contains("write 64K"), "{:?}", screen.text());
        p.finish();
        assert!(screen.text().ends_with("<clear>"), "{:?}", screen.text());
    }

    /// Nothing is drawn before the delay, and a run that ends first leaves no line.
    #[test]
    fn nothing_before_the_delay() {
        let (mut p, screen) = line(Duration::from_secs(3600));
        p.update(5, 10);
        std::thread::sleep(3 * TICK);
        p.finish();
        assert_eq!(screen.text(), "");
    }
}
