//! Bounded spin-waiting: every wait of the executor ends, by success, by timeout, or because
//! another device already failed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Why a wait ended without its condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitFailure {
    /// The timeout elapsed; the wait began at `since`.
    TimedOut { since: Instant },
    /// Another device failed; this one gives up without an error of its own.
    Aborted,
}

/// Polls a condition with back-off (spin, then yield, then short sleeps: the 2-core CI machine
/// runs up to 8 devices' threads).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiter<'a> {
    pub(crate) timeout: Duration,
    pub(crate) abort: &'a AtomicBool,
}

impl Waiter<'_> {
    /// Waits for `condition`, from now.
    pub(crate) fn until(&self, condition: impl FnMut() -> bool) -> Result<(), WaitFailure> {
        self.until_from(Instant::now(), condition)
    }

    /// Waits for `condition`, the timeout counting from `start`. A wait past its deadline
    /// reports the timeout even if another device aborted meanwhile, so that the earliest
    /// stuck wait is always reported, however the threads were scheduled.
    pub(crate) fn until_from(
        &self,
        start: Instant,
        mut condition: impl FnMut() -> bool,
    ) -> Result<(), WaitFailure> {
        for round in 0u32.. {
            if condition() {
                return Ok(());
            }
            if start.elapsed() > self.timeout {
                return Err(WaitFailure::TimedOut { since: start });
            }
            if self.abort.load(Ordering::Relaxed) {
                return Err(WaitFailure::Aborted);
            }
            match round {
                0..64 => std::hint::spin_loop(),
                64..256 => thread::yield_now(),
                _ => thread::sleep(Duration::from_micros(20)),
            }
        }
        Err(WaitFailure::TimedOut { since: start })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_out_and_aborts() {
        let abort = AtomicBool::new(false);
        let w = Waiter {
            timeout: Duration::from_millis(5),
            abort: &abort,
        };
        assert!(matches!(
            w.until(|| false),
            Err(WaitFailure::TimedOut { .. })
        ));
        assert_eq!(w.until(|| true), Ok(()));
        abort.store(true, Ordering::Relaxed);
        assert_eq!(w.until(|| false), Err(WaitFailure::Aborted));
    }
}
