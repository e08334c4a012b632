//! Retries with doubling waits, and the HTTP facts about when another attempt may succeed:
//! what the kernel's two HTTP clients (the rollout engine's, `cairn_gateway::engine::EngineClient`,
//! and the `endpoint` reflector of [`crate::skills`]) share.

use std::time::Duration;

/// HTTP statuses that say "try again": 408 (request timeout), 429 (too many requests) and
/// every 5xx. Any other non-2xx answer would be the same the next time.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 500..=599)
}

/// One failed attempt, and whether another may succeed.
#[derive(Debug)]
pub struct Attempt<F> {
    pub failure: F,
    pub retry: bool,
}

/// Calls `attempt(0)`, `attempt(1)`, … until one succeeds, one fails with `retry = false`, or
/// `retries` retries have failed. Waits `first_wait` before the first retry and doubles the
/// wait after each, up to `max_wait`; `on_retry(n, &failure, wait)` is told before each wait.
///
/// # Errors
/// The last failure, with the number of attempts made (1 to `retries + 1`).
pub fn with_retries<T, F>(
    retries: u32,
    first_wait: Duration,
    max_wait: Duration,
    mut attempt: impl FnMut(u32) -> Result<T, Attempt<F>>,
    mut on_retry: impl FnMut(u32, &F, Duration),
) -> Result<T, (F, u32)> {
    let mut wait = first_wait;
    let mut n = 0u32;
    loop {
        match attempt(n) {
            Ok(value) => return Ok(value),
            Err(failed) if failed.retry && n < retries => {
                on_retry(n, &failed.failure, wait);
                std::thread::sleep(wait);
                wait = (wait * 2).min(max_wait);
                n += 1;
            }
            Err(failed) => return Err((failed.failure, n + 1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(retry: bool) -> Attempt<&'static str> {
        Attempt {
            failure: "down",
            retry,
        }
    }

    #[test]
    fn a_retryable_failure_is_tried_again_until_the_retries_are_spent() {
        let mut seen = Vec::new();
        let out: Result<(), _> = with_retries(
            3,
            Duration::ZERO,
            Duration::ZERO,
            |n| {
                seen.push(n);
                Err(fail(true))
            },
            |_, _, _| {},
        );
        assert_eq!(out.unwrap_err(), ("down", 4));
        assert_eq!(seen, [0, 1, 2, 3]);
    }

    #[test]
    fn a_final_failure_stops_at_once_and_a_success_ends_the_loop() {
        let out: Result<(), _> = with_retries(
            5,
            Duration::ZERO,
            Duration::ZERO,
            |_| Err(fail(false)),
            |_, _, _| {},
        );
        assert_eq!(out.unwrap_err(), ("down", 1));
        let mut told = Vec::new();
        let out = with_retries(
            5,
            Duration::ZERO,
            Duration::ZERO,
            |n| if n < 2 { Err(fail(true)) } else { Ok(n) },
            |n, f, _| told.push((n, *f)),
        );
        assert_eq!(out.unwrap(), 2);
        assert_eq!(told, [(0, "down"), (1, "down")]);
    }

    #[test]
    fn the_wait_doubles_up_to_its_cap() {
        let mut waits = Vec::new();
        let _: Result<(), _> = with_retries(
            3,
            Duration::from_millis(2),
            Duration::from_millis(5),
            |_| Err(fail(true)),
            |_, _, wait| waits.push(wait.as_millis()),
        );
        assert_eq!(waits, [2, 4, 5]);
    }

    #[test]
    fn only_timeouts_rate_limits_and_server_errors_are_retryable() {
        let retryable: Vec<u16> = [200, 400, 401, 404, 408, 422, 429, 500, 503, 599, 600]
            .into_iter()
            .filter(|&s| retryable_status(s))
            .collect();
        assert_eq!(retryable, [408, 429, 500, 503, 599]);
    }
}
