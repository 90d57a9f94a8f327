//! Kubernetes resource quantities ("1536Mi", "2G", "1.5Gi", "129e6") as whole bytes.

/// Parses a quantity into bytes, rounding fractions up (as the API server does for memory).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty quantity".into());
    }
    if s.starts_with('-') {
        return Err(format!("{text:?} is negative"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let (number, exponent) = match suffix.strip_prefix(['e', 'E']) {
        Some(exp) if !exp.is_empty() => {
            let exp: i32 = exp.parse().map_err(|_| format!("{text:?}: bad exponent"))?;
            (number, Some(exp))
        }
        _ => (number, None),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a quantity (e.g. 512Mi, 2Gi, 1G)"))?;
    let multiplier = match (exponent, suffix) {
        (Some(exp), _) => 10f64.powi(exp),
        (None, "") => 1.0,
        (None, "Ki") => 1024.0,
        (None, "Mi") => 1024f64.powi(2),
        (None, "Gi") => 1024f64.powi(3),
        (None, "Ti") => 1024f64.powi(4),
        (None, "Pi") => 1024f64.powi(5),
        (None, "Ei") => 1024f64.powi(6),
        (None, "k") => 1e3,
        (None, "M") => 1e6,
        (None, "G") => 1e9,
        (None, "T") => 1e12,
        (None, "P") => 1e15,
        (None, "E") => 1e18,
        // Milli-bytes appear in metrics for odd averages; they round up to whole bytes.
        (None, "m") => 1e-3,
        (None, other) => return Err(format!("{text:?}: unknown suffix {other:?}")),
    };
    let bytes = (value * multiplier).ceil();
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is too large"));
    }
    Ok(bytes as u64)
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
    fn parses_the_forms_kubernetes_writes() {
        for (text, bytes) in [
            ("0", 0),
            ("1536Mi", 1536 << 20),
            ("2Gi", 2 << 30),
            ("1.5Gi", 3 << 29),
            ("500M", 500_000_000),
            ("129e6", 129_000_000),
            ("1E3", 1000),
            ("64Ki", 65536),
            ("1k", 1000),
            ("1500m", 2),
            ("12345", 12345),
        ] {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn rejects_garbage() {
        for text in ["", "-1Mi", "Mi", "12XB", "1.2.3Gi", "1e"] {
            assert!(parse_bytes(text).is_err(), "{text} should be rejected");
        }
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
