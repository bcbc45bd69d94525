//! The one updating line `check` shows on stderr while it runs: the phase
//! (setup, commits, pauses, reads, sweep), the time elapsed and the time
//! left. Only when stderr is a terminal: piped or redirected, `check`
//! writes exactly what it wrote before, so scripts and tests that read its
//! stderr see no progress text at all.
//!
//! The line is redrawn by indicatif's own ticker thread, and the time left
//! is computed when it draws, from the current phase's planned end: the
//! probe loops only say when a phase starts, so the progress line costs
//! the back-to-back probes nothing.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// How often the line is redrawn: often enough for the seconds to tick.
const REDRAW: Duration = Duration::from_millis(100);

/// The current phase's planned end, and the planned time of the phases
/// after it.
#[derive(Debug, Clone, Copy)]
struct Plan {
    phase_end: Instant,
    after: Duration,
}

impl Plan {
    fn remaining(&self, now: Instant) -> Duration {
        self.phase_end.saturating_duration_since(now) + self.after
    }
}

#[derive(Debug)]
pub(crate) struct Progress {
    /// None when stderr is not a terminal (or the style did not build).
    bar: Option<ProgressBar>,
    plan: Arc<Mutex<Plan>>,
}

/// `7s`, `1m05s`: whole seconds, enough for a run of seconds to minutes.
pub(crate) fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else {
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

impl Progress {
    /// A progress line on stderr if it is a terminal; else one that shows
    /// nothing.
    pub(crate) fn new() -> Progress {
        let plan = Arc::new(Mutex::new(Plan {
            phase_end: Instant::now(),
            after: Duration::ZERO,
        }));
        let bar = std::io::stderr()
            .is_terminal()
            .then(|| Self::bar(plan.clone()))
            .flatten();
        Progress { bar, plan }
    }

    fn bar(plan: Arc<Mutex<Plan>>) -> Option<ProgressBar> {
        let style = ProgressStyle::with_template(
            "{spinner} check: {msg:<7}  elapsed {elapsed_s}  remaining {remaining}",
        )
        .ok()?
        .with_key(
            "elapsed_s",
            |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&fmt_secs(s.elapsed()));
            },
        )
        .with_key(
            "remaining",
            move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                let left = plan
                    .lock()
                    .map(|p| p.remaining(Instant::now()))
                    .unwrap_or_default();
                let _ = w.write_str(&fmt_secs(left));
            },
        );
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(style);
        bar.enable_steady_tick(REDRAW);
        Some(bar)
    }

    /// A phase starts: it should take `length` (zero when unknown, as for
    /// creating the probe files), and `after` is planned after it.
    pub(crate) fn phase(&self, name: &'static str, length: Duration, after: Duration) {
        if let Ok(mut p) = self.plan.lock() {
            *p = Plan {
                phase_end: Instant::now() + length,
                after,
            };
        }
        if let Some(bar) = &self.bar {
            bar.set_message(name);
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

impl Drop for Progress {
    /// The line is erased whichever way the run ends (done, interrupted,
    /// failed), so the report or the error starts on a clean line.
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_is_the_phase_rest_plus_the_phases_after_it() {
        let now = Instant::now();
        let p = Plan {
            phase_end: now + Duration::from_secs(3),
            after: Duration::from_secs(5),
        };
        assert_eq!(p.remaining(now), Duration::from_secs(8));
        // An overrun phase counts as done, not as negative time.
        assert_eq!(
            p.remaining(now + Duration::from_secs(10)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn seconds_and_minutes() {
        assert_eq!(fmt_secs(Duration::from_millis(7900)), "7s");
        assert_eq!(fmt_secs(Duration::from_secs(65)), "1m05s");
        assert_eq!(fmt_secs(Duration::ZERO), "0s");
    }
}
