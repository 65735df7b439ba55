//! The `mpi-webhook` binary: parses the command line and runs one subcommand. No logic here.

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use mpi_webhook::cli::{Cli, Command};
use mpi_webhook::{certs, offline, serve, tls};

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: in a pod stderr is a pipe to the log collector,
    // where escape codes would garble every line (and cost a little on each request's span).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
}

#[tokio::main]
async fn main() -> Result<ExitCode> {
    let cli = Cli::parse();
    init_tracing();
    tls::install_crypto_provider();
    match cli.command {
        Command::Review(args) => {
            println!("{}", offline::review(&args).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Render(args) => {
            let rendered = offline::render_dir(&args)?;
            print!("{}", rendered.yaml);
            for problem in &rendered.problems {
                eprintln!("skipped {problem}");
            }
            Ok(if rendered.problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Serve(args) => {
            serve::run(args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Certs(args) => {
            println!("{}", certs::run(&args)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Preflight(args) => Ok(ExitCode::from(
            mpi_webhook::preflight::run(&args).await.code(),
        )),
        Command::Reconcile(args) => {
            mpi_webhook::reconciler::run(args).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
