//! Kubernetes resource quantities ("1536Mi", "2G", "1.5Gi", "129e6") as whole bytes.

/// Why a text is not a quantity of bytes. The messages leave out the text itself: the caller
/// names the field and quotes the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("must not be negative")]
    Negative,
    #[error("expected a number followed by an optional suffix (Ki, Mi, Gi, k, M, G, ...)")]
    NotANumber,
    #[error("unknown suffix {suffix:?} (use Ki, Mi, Gi, Ti, k, M, G, T or e<N>)")]
    UnknownSuffix { suffix: String },
    /// More bytes than a u64 holds (16Ei less one byte).
    #[error("too large (at most 16Ei less one byte)")]
    TooLarge,
}

/// Bytes in a Kubernetes quantity: binary suffixes Ki..Ei, decimal m, k, M..E, exponents e/E, or
/// none. Fractional bytes round up (a threshold never moves below what was written).
pub fn parse_bytes(text: &str) -> Result<u64, QuantityError> {
    let s = text.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(QuantityError::Negative);
    }
    let number_len = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_len);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return Err(QuantityError::NotANumber);
    }
    // value = mantissa * 2^bin * 10^dec, with the fraction folded into dec.
    let (bin, dec): (u32, i64) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        _ => match suffix.strip_prefix(['e', 'E']).map(str::parse::<i64>) {
            Some(Ok(exp)) if exp.abs() <= 1000 => (0, exp),
            _ => {
                return Err(QuantityError::UnknownSuffix {
                    suffix: suffix.to_string(),
                });
            }
        },
    };
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(0);
    }
    let too_large = || QuantityError::TooLarge;
    if digits.len() > 38 {
        return Err(too_large());
    }
    let mantissa: u128 = digits.parse().map_err(|_| too_large())?;
    let scaled = mantissa.checked_mul(1u128 << bin).ok_or_else(too_large)?;
    let dec = dec - frac_part.len() as i64;
    let bytes = if dec >= 0 {
        let factor = u32::try_from(dec)
            .ok()
            .and_then(|d| 10u128.checked_pow(d))
            .ok_or_else(too_large)?;
        scaled.checked_mul(factor).ok_or_else(too_large)?
    } else {
        match u32::try_from(-dec).ok().and_then(|d| 10u128.checked_pow(d)) {
            Some(divisor) => scaled.div_ceil(divisor),
            // Smaller than any u128 divisor can express: a positive amount under one byte.
            None => 1,
        }
    };
    u64::try_from(bytes).map_err(|_| too_large())
}

/// Bytes as a short binary quantity for reports: "2Gi", "12.5Gi", "1544Mi", "86.3Mi", "640Ki".
/// Below 10Gi, memory is shown in Mi so that usage and a nearby threshold stay distinguishable.
pub fn format_bytes(bytes: u64) -> String {
    const KI: u64 = 1 << 10;
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;
    let short = |value: f64, unit: &str| {
        if value >= 100.0 || value.fract() < 0.05 {
            format!("{value:.0}{unit}")
        } else {
            format!("{value:.1}{unit}")
        }
    };
    if bytes >= GI && (bytes.is_multiple_of(GI) || bytes >= 10 * GI) {
        short(bytes as f64 / GI as f64, "Gi")
    } else if bytes >= MI {
        short(bytes as f64 / MI as f64, "Mi")
    } else if bytes >= KI {
        short(bytes as f64 / KI as f64, "Ki")
    } else {
        format!("{bytes}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_bytes() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("1073741824", 1 << 30),
            ("1536Mi", 1536 << 20),
            ("2Gi", 2 << 30),
            ("1.5Gi", 3 << 29),
            ("64Ki", 64 << 10),
            ("1Ti", 1 << 40),
            ("1Ei", 1 << 60),
            ("500M", 500_000_000),
            ("1G", 1_000_000_000),
            ("1k", 1000),
            ("1e9", 1_000_000_000),
            ("1E3", 1000),
            ("2.5e3", 2500),
            ("1.5", 2),
            ("100m", 1),
            ("1500m", 2),
            ("0.1Ki", 103),
            ("+1Mi", 1 << 20),
            ("007", 7),
            (".5k", 500),
            ("1e-50", 1),
            (" 1Gi ", 1 << 30),
        ];
        for (text, want) in cases {
            assert_eq!(parse_bytes(text), Ok(*want), "{text}");
        }
    }

    #[test]
    fn bad_quantities_are_rejected() {
        use QuantityError::*;
        let unknown = |suffix: &str| UnknownSuffix {
            suffix: suffix.into(),
        };
        let cases = [
            ("", NotANumber),
            ("-1Gi", Negative),
            ("-0", Negative),
            ("Gi", NotANumber),
            ("1GB", unknown("GB")),
            ("1gi", unknown("gi")),
            ("1.2.3", NotANumber),
            ("1 Gi", unknown(" Gi")),
            ("1e", unknown("e")),
            ("1e1.5", unknown("e1.5")),
            ("abc", NotANumber),
            ("16Ei", TooLarge),
            ("1e30", TooLarge),
        ];
        for (text, want) in cases {
            assert_eq!(parse_bytes(text), Err(want), "{text:?}");
        }
        // The words a person reads after the field and value.
        assert_eq!(Negative.to_string(), "must not be negative");
        assert_eq!(
            unknown("GB").to_string(),
            "unknown suffix \"GB\" (use Ki, Mi, Gi, Ti, k, M, G, T or e<N>)"
        );
        assert_eq!(
            TooLarge.to_string(),
            "too large (at most 16Ei less one byte)"
        );
    }

    #[test]
    fn formats_binary_units() {
        assert_eq!(format_bytes(1536 << 20), "1536Mi");
        assert_eq!(format_bytes(1544 << 20), "1544Mi");
        assert_eq!(format_bytes(25 << 29), "12.5Gi");
        assert_eq!(format_bytes(812 << 20), "812Mi");
        assert_eq!(format_bytes(2 << 30), "2Gi");
        assert_eq!(format_bytes(100), "100");
    }
}
