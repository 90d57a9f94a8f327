//! Per-workload overrides: annotations on a workload that change, for that workload only, the
//! memory threshold and the cooldown of every policy that selects it. The policy file stays the
//! default; the team that owns a workload tunes it where the workload is defined. An annotation
//! may make bouncer more careful freely, and less careful only as far as the policy's
//! `spec.overrides` bounds allow: whoever can annotate one workload must not be able to bounce
//! it every run and rank it first, ahead of a real leak elsewhere.

use std::borrow::Cow;

use crate::core::literals::{
    COOLDOWN_ANNOTATION, MEMORY_ABOVE_ANNOTATION, PERCENT_OF_LIMIT_ANNOTATION,
};
use crate::core::model::Workload;
use crate::core::policy::{Policy, Threshold, bytes_value, duration_value, percent_value};
use crate::core::quantity::format_bytes;
use crate::core::reasons::SkipReason;

/// `policy` as it applies to `w`: its threshold and cooldown replaced by the workload's
/// override annotations. A threshold override changes the threshold the policy's memory trigger
/// has; it adds none to a policy without one. A bad value is a skip naming the annotation, never a guess.
pub fn effective<'p>(policy: &'p Policy, w: &Workload) -> Result<Cow<'p, Policy>, SkipReason> {
    let get = |key: &'static str| w.annotations.get(key).map(|v| (key, v.trim()));
    let above = get(MEMORY_ABOVE_ANNOTATION);
    let percent = get(PERCENT_OF_LIMIT_ANNOTATION);
    let cooldown = get(COOLDOWN_ANNOTATION);
    if above.is_none() && percent.is_none() && cooldown.is_none() {
        return Ok(Cow::Borrowed(policy));
    }
    let invalid = |(key, value): (&str, &str), problem: String| SkipReason::InvalidOverride {
        annotation: key.to_string(),
        value: value.to_string(),
        problem,
    };
    let incomparable = |kv: (&str, &str), field: &str| {
        let problem = format!(
            "the policy's threshold is of the other kind, so this one may loosen it only with spec.overrides.{field}"
        );
        invalid(kv, problem)
    };
    let floor = |(key, value): (&str, &str), field: &str, lowest: String| {
        let problem = format!(
            "below {lowest}, the loosest this policy allows (spec.overrides.{field}, else the policy's own value)"
        );
        invalid((key, value), problem)
    };
    let own = policy.memory.as_ref().and_then(|m| m.threshold);
    let threshold = match (above, percent) {
        (Some(a), Some(_)) => {
            let problem = format!(
                "set one of {MEMORY_ABOVE_ANNOTATION} and {PERCENT_OF_LIMIT_ANNOTATION}, not both"
            );
            return Err(invalid(a, problem));
        }
        (Some(a), None) => {
            let bytes = bytes_value(a.1).map_err(|p| invalid(a, p.to_string()))?;
            let lowest = match (policy.overrides.min_memory_above, own) {
                (Some(min), _) | (None, Some(Threshold::Bytes(min))) => Some(min),
                _ => None,
            };
            match lowest {
                Some(min) if bytes < min => {
                    return Err(floor(a, "minMemoryAbove", format_bytes(min)));
                }
                // The policy's threshold is a percentage: bytes compare with nothing there.
                None if own.is_some() => return Err(incomparable(a, "minMemoryAbove")),
                _ => {}
            }
            Some(Threshold::Bytes(bytes))
        }
        (None, Some(p)) => {
            let number =
                p.1.parse::<f64>()
                    .map_err(|_| invalid(p, "not a number".into()))?;
            let number = percent_value(number).map_err(|e| invalid(p, e.to_string()))?;
            let lowest = match (policy.overrides.min_percent_of_limit, own) {
                (Some(min), _) | (None, Some(Threshold::PercentOfLimit(min))) => Some(min),
                _ => None,
            };
            match lowest {
                Some(min) if number < min => {
                    return Err(floor(p, "minPercentOfLimit", format!("{min}%")));
                }
                None if own.is_some() => return Err(incomparable(p, "minPercentOfLimit")),
                _ => {}
            }
            Some(Threshold::PercentOfLimit(number))
        }
        (None, None) => None,
    };
    let mut out = policy.clone();
    // Only a threshold the policy has: a history-only trigger (growth, predict to the limit)
    // gains no threshold trigger from an annotation.
    if let (Some(threshold), Some(memory)) = (threshold, out.memory.as_mut())
        && memory.threshold.is_some()
    {
        memory.threshold = Some(threshold);
    }
    if let Some(c) = cooldown {
        let value = duration_value(c.1).map_err(|p| invalid(c, p.to_string()))?;
        let lowest = policy.overrides.min_cooldown.unwrap_or(policy.cooldown);
        if value < lowest {
            let lowest = humantime::format_duration(lowest).to_string();
            return Err(floor(c, "minCooldown", lowest));
        }
        out.cooldown = value;
    }
    Ok(Cow::Owned(out))
}
