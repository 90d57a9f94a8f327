//! Where a policy document's problems are collected as it is validated (its file, document
//! and policy named in each), shared by the validation of the fields and of their bounds.

use std::fmt::Display;

use super::PolicyError;

/// Where problems go while one document is validated.
pub(in crate::core::policy) struct Check<'a> {
    file: &'a str,
    document: usize,
    policy: Option<String>,
    errors: &'a mut Vec<PolicyError>,
    failed: bool,
}

impl<'a> Check<'a> {
    pub(in crate::core::policy) fn new(
        file: &'a str,
        document: usize,
        policy: Option<String>,
        errors: &'a mut Vec<PolicyError>,
    ) -> Self {
        Check {
            file,
            document,
            policy,
            errors,
            failed: false,
        }
    }

    /// The problem is kept as its words: a [`PolicyError`] is a record of where and what, which
    /// `validate` prints, serializes and annotates field by field.
    pub(in crate::core::policy) fn error(
        &mut self,
        field: Option<String>,
        value: Option<String>,
        problem: impl Display,
    ) {
        self.failed = true;
        self.errors.push(PolicyError {
            file: Some(self.file.to_owned()),
            document: Some(self.document),
            policy: self.policy.clone(),
            line: None,
            column: None,
            field,
            value,
            problem: problem.to_string(),
        });
    }

    /// A problem with a string value, quoted in the message.
    pub(in crate::core::policy) fn bad(
        &mut self,
        field: impl Into<String>,
        value: &str,
        problem: impl Display,
    ) {
        self.error(Some(field.into()), Some(format!("{value:?}")), problem);
    }

    pub(in crate::core::policy) fn at(&mut self, field: impl Into<String>, problem: impl Display) {
        self.error(Some(field.into()), None, problem);
    }

    pub(in crate::core::policy) fn failed(&self) -> bool {
        self.failed
    }

    pub(in crate::core::policy) fn file(&self) -> &str {
        self.file
    }

    pub(in crate::core::policy) fn document(&self) -> usize {
        self.document
    }
}
