//! The rules for setting values that a policy file and a workload's override annotations share,
//! so both accept and refuse the same things with the same words.

use std::time::Duration;

use crate::core::quantity::parse_bytes;

/// A duration (cooldown, timeouts): longer than zero, at most 100 years (the planner does date
/// arithmetic with it, and absurd lengths would overflow there).
pub fn duration_value(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be longer than zero".into()),
        Ok(d) if d > Duration::from_secs(100 * 366 * 86400) => {
            Err("must be at most 100 years".into())
        }
        Ok(d) => Ok(d),
        Err(e) => Err(format!(
            "not a duration such as \"90m\", \"6h\" or \"1h 30m\" ({e})"
        )),
    }
}

/// A memory threshold in bytes: a quantity of more than 0 bytes.
pub fn bytes_value(text: &str) -> Result<u64, String> {
    match parse_bytes(text)? {
        0 => Err("must be more than 0 bytes".into()),
        bytes => Ok(bytes),
    }
}

/// A percentage of the memory limit: more than 0, at most 100.
pub fn percent_value(percent: f64) -> Result<f64, String> {
    if percent.is_finite() && percent > 0.0 && percent <= 100.0 {
        Ok(percent)
    } else {
        Err("must be more than 0 and at most 100".into())
    }
}
