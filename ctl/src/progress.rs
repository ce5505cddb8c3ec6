//! Progress of `ringctl bootstrap` and `ringctl restore` on a terminal.

use std::time::Duration;

/// Progress on a terminal: an indicatif spinner and one line per finished step
/// (plain lines when stderr is not a terminal).
pub struct TerminalProgress {
    bar: indicatif::ProgressBar,
}

impl Default for TerminalProgress {
    fn default() -> Self {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(Duration::from_millis(120));
        TerminalProgress { bar }
    }
}

impl bootstrap::Progress for TerminalProgress {
    fn step(&self, label: &str) {
        self.bar.set_message(label.to_string());
    }
    fn finished(&self, label: &str, took: Duration) {
        let line = format!("  ok  {label} ({:.1}s)", took.as_secs_f64());
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }
}

impl Drop for TerminalProgress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
