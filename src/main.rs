//! The `bouncer` binary: parse the command line and environment, set up logging, run, exit.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = bouncer::cli::Cli::parse();
    let env = match bouncer::cli::Env::from_env() {
        Ok(env) => env,
        Err(e) => {
            eprintln!("bouncer: {e}");
            return bouncer::ExitStatus::Invalid.into();
        }
    };
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime starts");
    runtime.block_on(bouncer::main(cli, env, host)).into()
}
