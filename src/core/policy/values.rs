//! The rules for setting values that a policy file and a workload's override annotations share,
//! so both accept and refuse the same things with the same words.

use std::time::Duration;

use crate::core::quantity::{QuantityError, parse_bytes};

/// The longest duration a setting may have (see [`duration_value`]).
const MAX_DURATION: Duration = Duration::from_secs(100 * 366 * 86400);

/// Why a value was refused. The messages name neither the field nor the value: a policy error
/// puts them in front (`file: document: field: value: problem`), a skip names the annotation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    #[error("not a duration such as \"90m\", \"6h\" or \"1h 30m\" ({source})")]
    NotADuration {
        #[source]
        source: humantime::DurationError,
    },
    #[error("must be longer than zero")]
    ZeroDuration,
    #[error("must be at most 100 years")]
    DurationTooLong { duration: Duration },
    #[error(transparent)]
    Quantity(#[from] QuantityError),
    #[error("must be more than 0 bytes")]
    ZeroBytes,
    #[error("must be more than 0 and at most 100")]
    PercentOutOfRange { percent: f64 },
}

/// A duration (cooldown, timeouts): longer than zero, at most 100 years (the planner does date
/// arithmetic with it, and absurd lengths would overflow there).
pub fn duration_value(text: &str) -> Result<Duration, ValueError> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err(ValueError::ZeroDuration),
        Ok(d) if d > MAX_DURATION => Err(ValueError::DurationTooLong { duration: d }),
        Ok(d) => Ok(d),
        Err(source) => Err(ValueError::NotADuration { source }),
    }
}

/// A memory threshold in bytes: a quantity of more than 0 bytes.
pub fn bytes_value(text: &str) -> Result<u64, ValueError> {
    match parse_bytes(text)? {
        0 => Err(ValueError::ZeroBytes),
        bytes => Ok(bytes),
    }
}

/// A percentage of the memory limit: more than 0, at most 100.
pub fn percent_value(percent: f64) -> Result<f64, ValueError> {
    if percent.is_finite() && percent > 0.0 && percent <= 100.0 {
        Ok(percent)
    } else {
        Err(ValueError::PercentOutOfRange { percent })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_refused_with_their_reason() {
        assert!(matches!(
            duration_value("soon"),
            Err(ValueError::NotADuration { .. })
        ));
        assert_eq!(duration_value("0s"), Err(ValueError::ZeroDuration));
        assert!(matches!(
            duration_value("101y"),
            Err(ValueError::DurationTooLong { .. })
        ));
        assert_eq!(duration_value("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(bytes_value("0Mi"), Err(ValueError::ZeroBytes));
        assert_eq!(
            bytes_value("-1"),
            Err(ValueError::Quantity(QuantityError::Negative))
        );
        assert_eq!(bytes_value("1Ki"), Ok(1024));
        for bad in [0.0, -1.0, 100.5, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(
                    percent_value(bad),
                    Err(ValueError::PercentOutOfRange { .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(percent_value(100.0), Ok(100.0));
    }

    #[test]
    fn the_words_a_person_reads() {
        let not_a_duration = duration_value("soon").unwrap_err().to_string();
        assert!(
            not_a_duration.starts_with("not a duration such as \"90m\", \"6h\" or \"1h 30m\" ("),
            "{not_a_duration}"
        );
        assert_eq!(
            duration_value("0s").unwrap_err().to_string(),
            "must be longer than zero"
        );
        assert_eq!(
            duration_value("101y").unwrap_err().to_string(),
            "must be at most 100 years"
        );
        assert_eq!(
            bytes_value("0").unwrap_err().to_string(),
            "must be more than 0 bytes"
        );
        assert_eq!(
            bytes_value("-1").unwrap_err().to_string(),
            "must not be negative"
        );
        assert_eq!(
            percent_value(0.0).unwrap_err().to_string(),
            "must be more than 0 and at most 100"
        );
    }
}
