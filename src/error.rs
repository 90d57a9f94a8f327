//! The errors that end a command, and the one place their exit code is chosen.
//!
//! What a run's report says is not an error: a failed or halted bounce exits 1 and a held lock
//! exits 0 from the report, as [`ExitStatus`] values the commands return themselves.

use crate::ExitStatus;
use crate::cli::settings::SettingsError;
use crate::cli::target::ResolveError;
use crate::cluster::error::ClusterError;
use crate::core::model::WorkloadRef;
use crate::core::policy::LoadError;

/// Why a command stopped. Printed once, as `bouncer: {error}`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag or `BOUNCER_*` variable was refused.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// Every problem of every policy file, one per line.
    #[error("invalid policies:\n{0}")]
    Policies(#[from] LoadError),
    /// `validate -o json|github`: the problems are the command's output on standard output,
    /// which a CI step reads; the log gets this one line rather than the list again.
    #[error(
        "{} in the policies (listed on standard output)",
        problems(.0.errors.len())
    )]
    PoliciesListed(LoadError),
    /// The words after `explain` name no workload.
    #[error("explain: {0}")]
    Target(#[from] ResolveError),
    #[error(
        "explain: {target} not found (no such workload in the namespaces bouncer reads, or no pod of it is running)"
    )]
    NotFound { target: WorkloadRef },
    /// The cluster could not be reached, read, or refused bouncer. Boxed: it is the largest
    /// by far, and every command's result would carry its size.
    #[error(transparent)]
    Cluster(Box<ClusterError>),
}

impl From<ClusterError> for Error {
    fn from(e: ClusterError) -> Error {
        Error::Cluster(Box::new(e))
    }
}

fn problems(n: usize) -> String {
    match n {
        1 => "1 problem".into(),
        n => format!("{n} problems"),
    }
}

impl Error {
    /// The exit code of a command that stopped with this error (see [`ExitStatus`]).
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            Error::Settings(_)
            | Error::Policies(_)
            | Error::PoliciesListed(_)
            | Error::Target(_) => ExitStatus::Invalid,
            // Nothing was wrong with the input: the cluster has no such workload.
            Error::NotFound { .. } => ExitStatus::Failed,
            Error::Cluster(_) => ExitStatus::Cluster,
        }
    }
}

/// Prints `error` once and returns its exit code: how every command that fails ends.
pub fn exit_with(error: &Error) -> ExitStatus {
    eprintln!("bouncer: {error}");
    error.exit_status()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::explain::TargetError;
    use crate::core::model::Kind;
    use crate::core::policy::parse_str;

    fn load_error() -> LoadError {
        parse_str("p.yaml", "kind: BouncePolicy\n").unwrap_err()
    }

    #[test]
    fn each_error_has_its_exit_code() {
        let settings = SettingsError::NoBounces.into();
        let target = ResolveError::Target(TargetError::Shape { text: "x".into() }).into();
        let not_found = Error::NotFound {
            target: WorkloadRef {
                kind: Kind::Deployment,
                namespace: "shop".into(),
                name: "web".into(),
            },
        };
        let cluster = ClusterError::Config("no kubeconfig".into()).into();
        for (error, code) in [
            (settings, 2),
            (Error::Policies(load_error()), 2),
            (Error::PoliciesListed(load_error()), 2),
            (target, 2),
            (not_found, 1),
            (cluster, 3),
        ] {
            assert_eq!(error.exit_status() as u8, code, "{error:?}");
        }
    }

    #[test]
    fn the_words_a_person_reads() {
        let errors = load_error();
        assert_eq!(
            Error::Policies(errors.clone()).to_string(),
            format!("invalid policies:\n{errors}")
        );
        let listed = Error::PoliciesListed(errors.clone()).to_string();
        assert!(
            listed.ends_with(" in the policies (listed on standard output)"),
            "{listed}"
        );
        let not_found = Error::NotFound {
            target: WorkloadRef {
                kind: Kind::Deployment,
                namespace: "shop".into(),
                name: "web".into(),
            },
        };
        assert_eq!(
            not_found.to_string(),
            "explain: deployment/shop/web not found (no such workload in the namespaces bouncer \
             reads, or no pod of it is running)"
        );
        let target: Error = ResolveError::Shape {
            target: "web".into(),
        }
        .into();
        assert!(
            target
                .to_string()
                .starts_with("explain: \"web\": expected KIND/NAME")
        );
        assert_eq!(problems(1), "1 problem");
        assert_eq!(problems(3), "3 problems");
    }
}
