//! Unknown `BOUNCER_*` variables are errors: a typo such as `BOUNCER_DRYRUN=true` must never
//! mean a real run. Checked before anything else, so a typo costs no API call.

use serde::de::{self, Deserializer, Visitor};

/// Variables that bouncer's own build, test and release scripts read. They are not settings of
/// bouncer, but a person who ran the test kit in the same shell has them set, so they are allowed
/// (and ignored) rather than refused. Exact names, then prefixes.
pub const TOOLING: &[&str] = &[
    "BOUNCER_BIN",
    "BOUNCER_CACHE_DIR",
    "BOUNCER_CLUSTER_DIR",
    "BOUNCER_CLUSTER_NODE",
    "BOUNCER_NODES",
    "BOUNCER_NODE_CLUSTER_DIR",
    "BOUNCER_REQUIRE_CLUSTER",
    "BOUNCER_STATIC_BIN",
];
pub const TOOLING_PREFIXES: &[&str] = &["BOUNCER_TEST_", "BOUNCER_KEEP_", "BOUNCER_IMAGE_"];

/// Read by the log filter rather than by [`super::Env`].
const LOG_FILTER: &str = "log";

/// Every `BOUNCER_*` setting bouncer reads, upper case with the prefix: `own` (the settings
/// struct's fields), the notify module's and the log filter.
pub fn known(own: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = own
        .iter()
        .copied()
        .chain(struct_fields::<crate::notify::Env>().iter().copied())
        .chain([LOG_FILTER])
        .map(|n| format!("BOUNCER_{}", n.to_ascii_uppercase()))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A `BOUNCER_*` variable bouncer does not read, with the known name closest to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown environment variable {name} (did you mean {closest}?); bouncer refuses to start \
     rather than ignore a setting it does not know. Known: {}",
    .known.join(", ")
)]
pub struct UnknownVariable {
    pub name: String,
    pub closest: String,
    pub known: Vec<String>,
}

/// The first unknown `BOUNCER_*` name among `names`, as an error naming the closest of `known`.
pub fn unknown(
    names: impl IntoIterator<Item = String>,
    known: &[String],
) -> Result<(), UnknownVariable> {
    let mut unknown: Vec<String> = names
        .into_iter()
        .filter(|n| n.starts_with("BOUNCER_"))
        .filter(|n| !known.contains(n) && !tooling(n))
        .collect();
    unknown.sort();
    let Some(name) = unknown.first() else {
        return Ok(());
    };
    let closest = known
        .iter()
        .min_by_key(|k| (distance(name, k), k.as_str()))
        .expect("bouncer knows some variables");
    Err(UnknownVariable {
        name: name.clone(),
        closest: closest.clone(),
        known: known.to_vec(),
    })
}

fn tooling(name: &str) -> bool {
    TOOLING.contains(&name) || TOOLING_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Levenshtein distance over bytes (the names are ASCII).
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The field names a derived `Deserialize` struct asks for (it hands them to
/// `deserialize_struct`), so a field added to the notify settings is known without a list.
fn struct_fields<'de, T: serde::Deserialize<'de>>() -> &'static [&'static str] {
    struct Fields(&'static [&'static str]);
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("field names recorded")
        }
    }
    impl std::error::Error for Stop {}
    impl de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Stop
        }
    }
    impl<'de> Deserializer<'de> for &mut Fields {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = fields;
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut fields = Fields(&[]);
    let _ = T::deserialize(&mut fields);
    fields.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few of the settings struct's own names (settings.rs checks the real list).
    fn known() -> Vec<String> {
        let own = [
            "dry_run",
            "max_bounces",
            "namespaces",
            "verify_settle",
            "kubeconfig",
        ];
        super::known(&[&own[..], &["log_format"]].concat())
    }

    fn check(names: &[&str]) -> Result<(), UnknownVariable> {
        unknown(names.iter().map(|n| n.to_string()), &known())
    }

    #[test]
    fn a_typo_names_the_variable_and_the_closest_known_one() {
        for (typo, closest) in [
            ("BOUNCER_DRYRUN", "BOUNCER_DRY_RUN"),
            ("BOUNCER_DRY_RUNN", "BOUNCER_DRY_RUN"),
            ("BOUNCER_MAX_BOUNCE", "BOUNCER_MAX_BOUNCES"),
            ("BOUNCER_NAMESPACE", "BOUNCER_NAMESPACES"),
            (
                "BOUNCER_NOTIFY_SLACK_URLFILE",
                "BOUNCER_NOTIFY_SLACK_URL_FILE",
            ),
        ] {
            let err = check(&["HOME", "BOUNCER_DRY_RUN", typo]).unwrap_err();
            assert_eq!((err.name.as_str(), err.closest.as_str()), (typo, closest));
        }
        let err = check(&["BOUNCER_DRYRUN"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "unknown environment variable BOUNCER_DRYRUN (did you mean BOUNCER_DRY_RUN?); \
                 bouncer refuses to start rather than ignore a setting it does not know. Known: {}",
                known().join(", ")
            )
        );
    }

    #[test]
    fn every_setting_the_structs_read_is_known_and_others_are_ignored() {
        let known = known();
        for name in [
            "BOUNCER_DRY_RUN",
            "BOUNCER_VERIFY_SETTLE",
            "BOUNCER_KUBECONFIG",
            "BOUNCER_LOG",
            "BOUNCER_LOG_FORMAT",
            // From the notify module's own struct, found by asking serde for its fields.
            "BOUNCER_NOTIFY_SLACK_URL",
            "BOUNCER_NOTIFY_WEBHOOK_URL_FILE",
            "BOUNCER_PUSHGATEWAY_URL",
            "BOUNCER_CLUSTER_NAME",
        ] {
            assert!(known.contains(&name.to_string()), "{name} in {known:?}");
        }
        assert!(struct_fields::<crate::notify::Env>().contains(&"notify_on"));
        // Other programs' variables and the test kit's are not bouncer's business.
        check(&["PATH", "KUBECONFIG", "XBOUNCER_X", "BOUNCER_CACHE_DIR"]).unwrap();
        check(&["BOUNCER_TEST_KUBECONFIG", "BOUNCER_KEEP_CLUSTER"]).unwrap();
        check(&["BOUNCER_IMAGE_LEAKY", "BOUNCER_CLUSTER_DIR"]).unwrap();
        assert!(check(&["BOUNCER_"]).is_err());
    }

    #[test]
    fn distance_counts_edits() {
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("same", "same"), 0);
    }
}
