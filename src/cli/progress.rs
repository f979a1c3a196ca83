//! Progress of `mslc run --iterations N`: an indicatif bar on stderr that appears only when
//! stderr is a terminal and the iterations have already taken a second, so quick runs, pipes
//! and tests see nothing.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long the iterations run before the bar appears.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// The bar, hidden until it is worth showing.
pub struct Progress {
    bar: ProgressBar,
    start: Instant,
    /// Whether the bar may ever show: a terminal on stderr and more than one iteration.
    may_show: bool,
    shown: bool,
}

impl Progress {
    /// A hidden bar for `total` iterations.
    pub fn new(total: u64) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        if let Ok(style) =
            ProgressStyle::with_template("{bar:40} {pos}/{len} forwards, {elapsed} (eta {eta})")
        {
            bar.set_style(style);
        }
        Progress {
            bar,
            start: Instant::now(),
            may_show: total > 1 && std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    /// Records that `done` iterations have finished; shows the bar once a second has passed.
    pub fn set(&mut self, done: u64) {
        self.bar.set_position(done);
        if self.may_show && !self.shown && self.start.elapsed() >= SHOW_AFTER {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown = true;
        }
    }

    /// Removes the bar (if it showed) before the summary prints.
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}
