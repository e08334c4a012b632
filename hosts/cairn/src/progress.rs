//! Terminal progress for long work: an indicatif bar per phase, log lines for notes and
//! evaluations. Bars go to stderr and disappear when stderr is not a terminal.

use cairn_kernel::trainer::Event;
use indicatif::{ProgressBar, ProgressStyle};

/// Renders trainer events.
#[derive(Default)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    fn println(&self, line: &str) {
        // Printed above the bar when there is one; `ProgressBar::println` would drop the
        // line when stderr is not a terminal (logs, CI).
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    pub fn on_event(&mut self, event: cairn_kernel::trainer::Event) {
        match event {
            Event::PhaseStarted { name, total } => {
                let bar = ProgressBar::new(total);
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix:>10} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} (eta {eta}) {msg}",
                    )
                    .expect("the progress template is valid")
                    .progress_chars("=> "),
                );
                bar.set_prefix(name);
                self.bar = Some(bar);
            }
            Event::Progress { done, message } => {
                if let Some(bar) = &self.bar {
                    bar.set_position(done);
                    bar.set_message(message);
                }
            }
            Event::PhaseFinished => {
                if let Some(bar) = self.bar.take() {
                    bar.finish();
                }
            }
            Event::Step(_) => {}
            Event::Eval { label, report } => {
                self.println(&format!("eval {label}: {}", report.summary()))
            }
            Event::Note(text) => self.println(&text),
        }
    }
}
