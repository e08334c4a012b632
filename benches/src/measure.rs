//! Timing and memory readings, the same way `scripts/bench/reference.py` takes them: warm-up
//! calls, then timed repetitions; resident set size from `/proc/self/status`.

use std::time::Instant;

/// `(VmRSS, VmHWM)` of this process in KiB (0 when `/proc` is unavailable).
pub fn rss_kb() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU seconds this process has used, all threads together.
pub fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and the clock id is a constant the libc
    // defines; clock_gettime writes only into `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Wall and CPU seconds of each timed call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Times {
    pub wall_s: Vec<f64>,
    pub cpu_s: Vec<f64>,
}

/// Runs `f` `warmup` times untimed, then `reps` times timed; returns the times of each timed
/// call and the last value.
pub fn timed<T>(
    warmup: usize,
    reps: usize,
    mut f: impl FnMut() -> anyhow::Result<T>,
) -> anyhow::Result<(Times, T)> {
    let mut last = None;
    for _ in 0..warmup {
        last = Some(f()?);
    }
    let mut times = Times::default();
    for _ in 0..reps {
        let (t, c) = (Instant::now(), cpu_seconds());
        last = Some(f()?);
        times.cpu_s.push(cpu_seconds() - c);
        times.wall_s.push(t.elapsed().as_secs_f64());
    }
    let last = last.ok_or_else(|| anyhow::anyhow!("warmup + reps must be at least 1"))?;
    Ok((times, last))
}

/// The median of `xs` (mean of the middle two for an even count); `None` when empty.
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn timed_counts_only_the_timed_reps() {
        let mut calls = 0;
        let (times, last) = timed(2, 3, || {
            calls += 1;
            Ok(calls)
        })
        .unwrap();
        assert_eq!(
            (times.wall_s.len(), times.cpu_s.len(), last, calls),
            (3, 3, 5, 5)
        );
        assert!(timed(0, 0, || Ok(())).is_err());
    }
}
