//! The `bouncer` binary: parse the command line and environment, set up logging, run, exit.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    limit_heap_growth();
    let cli = bouncer::cli::Cli::parse();
    let env = match bouncer::cli::Env::from_env() {
        Ok(env) => env,
        Err(e) => return bouncer::exit_with(&e.into()).into(),
    };
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into());
    // One thread: the snapshot's LISTs are concurrent on one task anyway, and a runtime with a
    // worker (and a malloc arena) per core would make memory grow with the node's size.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime starts");
    let log_filter = std::env::var("BOUNCER_LOG").ok();
    runtime
        .block_on(bouncer::main(cli, env, host, log_filter))
        .into()
}

/// glibc raises its mmap threshold to the size of each large block freed, up to 32 MiB, so after
/// the first page of a LIST (a few MiB) every later page buffer comes from the heap and stays
/// there. A fixed threshold keeps large buffers in mmap, returned to the system when freed: the
/// peak RSS of a snapshot drops by about a quarter.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_heap_growth() {
    const M_MMAP_THRESHOLD: i32 = -3;
    unsafe extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    // SAFETY: mallopt only sets an allocator parameter; it runs before any other thread exists.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_heap_growth() {}
