//! `spec.overrides`: how far a workload's override annotations may loosen a policy. Each bound
//! is at most the policy's own value (a bound above it would forbid the policy's own value);
//! a threshold bound needs a memory threshold to bound.

use std::time::Duration;

use super::check::Check;
use super::raw::RawOverrides;
use super::values::ValueError;
use super::{OverrideBounds, Threshold, bytes_value, duration_value, percent_value};
use crate::core::quantity::format_bytes;

const FIELD: &str = "spec.overrides";

/// Why a bound was refused; the policy error names the bound's field and value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum BoundError {
    #[error(transparent)]
    Value(#[from] ValueError),
    #[error("the policy has no memory threshold for an annotation to change")]
    NoThreshold,
    /// Looser than the policy itself: `own` is the policy's value in its field's words.
    #[error("must be at most {field} ({own})")]
    AbovePolicy { field: &'static str, own: String },
}

/// The validated bounds. `threshold` is the memory trigger's: `None` without a memory
/// trigger, `Some(None)` when it did not validate (nothing to compare with then) or has no
/// threshold. `cooldown` is `None` when `spec.cooldown` did not validate.
pub(super) fn overrides(
    check: &mut Check,
    raw: Option<RawOverrides>,
    threshold: Option<Option<Option<Threshold>>>,
    cooldown: Option<Duration>,
) -> Option<OverrideBounds> {
    let Some(raw) = raw else {
        return Some(OverrideBounds::default());
    };
    let mut ok = true;
    let mut fail = |check: &mut Check, field: &str, value: String, problem: BoundError| {
        check.error(Some(format!("{FIELD}.{field}")), Some(value), problem);
        ok = false;
    };
    // What a threshold bound can bound: the policy's threshold, once it validated.
    let has_threshold = match threshold {
        None | Some(Some(None)) => Some(false),
        Some(None) => None,
        Some(Some(Some(_))) => Some(true),
    };
    let own = threshold.flatten().flatten();

    let mut min_memory_above = None;
    if let Some(q) = raw.min_memory_above {
        let value = format!("{:?}", q.0);
        match bytes_value(&q.0) {
            Err(problem) => fail(check, "minMemoryAbove", value, problem.into()),
            Ok(_) if has_threshold == Some(false) => {
                fail(check, "minMemoryAbove", value, BoundError::NoThreshold)
            }
            Ok(bytes) => match own {
                Some(Threshold::Bytes(above)) if bytes > above => fail(
                    check,
                    "minMemoryAbove",
                    value,
                    BoundError::AbovePolicy {
                        field: "spec.triggers.memory.above",
                        own: format_bytes(above),
                    },
                ),
                _ => min_memory_above = Some(bytes),
            },
        }
    }
    let mut min_percent_of_limit = None;
    if let Some(p) = raw.min_percent_of_limit {
        let value = p.to_string();
        match percent_value(p) {
            Err(problem) => fail(check, "minPercentOfLimit", value, problem.into()),
            Ok(_) if has_threshold == Some(false) => {
                fail(check, "minPercentOfLimit", value, BoundError::NoThreshold)
            }
            Ok(p) => match own {
                Some(Threshold::PercentOfLimit(own)) if p > own => fail(
                    check,
                    "minPercentOfLimit",
                    value,
                    BoundError::AbovePolicy {
                        field: "spec.triggers.memory.percentOfLimit",
                        own: own.to_string(),
                    },
                ),
                _ => min_percent_of_limit = Some(p),
            },
        }
    }
    let mut min_cooldown = None;
    if let Some(text) = raw.min_cooldown {
        let value = format!("{text:?}");
        match (duration_value(&text), cooldown) {
            (Err(problem), _) => fail(check, "minCooldown", value, problem.into()),
            (Ok(d), Some(own)) if d > own => fail(
                check,
                "minCooldown",
                value,
                BoundError::AbovePolicy {
                    field: "spec.cooldown",
                    own: humantime::format_duration(own).to_string(),
                },
            ),
            (Ok(d), _) => min_cooldown = Some(d),
        }
    }
    ok.then_some(OverrideBounds {
        min_memory_above,
        min_percent_of_limit,
        min_cooldown,
    })
}

#[cfg(test)]
mod tests {
    use super::BoundError;
    use crate::core::policy::values::ValueError;
    use crate::core::policy::{LoadError, OverrideBounds, PolicyError, parse_str};

    fn load(spec_extra: &str) -> Result<OverrideBounds, LoadError> {
        let text = format!(
            "apiVersion: bouncer.dev/v1alpha1\nkind: BouncePolicy\nmetadata: {{name: p}}\n\
             spec:\n  target: {{selector: {{matchLabels: {{app: x}}}}}}\n  cooldown: 1h\n{spec_extra}"
        );
        parse_str("p.yaml", &text).map(|mut p| p.remove(0).overrides)
    }

    /// The one problem of a policy that fails to load.
    fn problem(spec_extra: &str) -> PolicyError {
        let mut errors = load(spec_extra).unwrap_err().errors;
        assert_eq!(errors.len(), 1, "{spec_extra}: {errors:?}");
        errors.remove(0)
    }

    #[test]
    fn bounds_are_at_most_the_policys_own_values() {
        let memory = "  triggers: {memory: {above: 1Gi}}\n";
        assert_eq!(load(memory).unwrap(), OverrideBounds::default());
        let set = load(&format!(
            "{memory}  overrides: {{minMemoryAbove: 512Mi, minPercentOfLimit: 60, minCooldown: 10m}}\n"
        ))
        .unwrap();
        assert_eq!(set.min_memory_above, Some(512 << 20));
        assert_eq!(set.min_percent_of_limit, Some(60.0));
        assert_eq!(set.min_cooldown.map(|d| d.as_secs()), Some(600));
        let above = |field, own: &str| BoundError::AbovePolicy {
            field,
            own: own.into(),
        };
        let not_a_duration = BoundError::Value(super::duration_value("soon").unwrap_err());
        let cases = [
            (
                format!("{memory}  overrides: {{minMemoryAbove: 2Gi}}\n"),
                "spec.overrides.minMemoryAbove",
                above("spec.triggers.memory.above", "1Gi"),
            ),
            (
                format!("{memory}  overrides: {{minCooldown: 2h}}\n"),
                "spec.overrides.minCooldown",
                above("spec.cooldown", "1h"),
            ),
            (
                "  triggers: {memory: {percentOfLimit: 80}}\n  overrides: {minPercentOfLimit: 90}\n"
                    .to_string(),
                "spec.overrides.minPercentOfLimit",
                above("spec.triggers.memory.percentOfLimit", "80"),
            ),
            (
                "  triggers: {schedule: {cron: '0 3 * * *'}}\n  overrides: {minMemoryAbove: 1Gi}\n"
                    .to_string(),
                "spec.overrides.minMemoryAbove",
                BoundError::NoThreshold,
            ),
            (
                format!("{memory}  overrides: {{minCooldown: soon}}\n"),
                "spec.overrides.minCooldown",
                not_a_duration,
            ),
            (
                format!("{memory}  overrides: {{minMemoryAbove: 0}}\n"),
                "spec.overrides.minMemoryAbove",
                BoundError::Value(ValueError::ZeroBytes),
            ),
        ];
        for (extra, field, want) in cases {
            let err = problem(&extra);
            assert_eq!(err.field.as_deref(), Some(field), "{extra}: {err}");
            assert_eq!(err.problem, want.to_string(), "{extra}: {err}");
            assert_eq!(err.file.as_deref(), Some("p.yaml"), "{extra}: {err}");
        }
        // The words of a bound, after its file and field.
        assert_eq!(
            problem(&format!("{memory}  overrides: {{minMemoryAbove: 2Gi}}\n")).to_string(),
            "p.yaml: document 1 (p): spec.overrides.minMemoryAbove: \"2Gi\": \
             must be at most spec.triggers.memory.above (1Gi)"
        );
        assert_eq!(
            BoundError::NoThreshold.to_string(),
            "the policy has no memory threshold for an annotation to change"
        );
    }
}
