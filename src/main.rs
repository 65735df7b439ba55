//! The `mpi-webhook` binary: parses the command line and runs one subcommand. No logic here.

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use mpi_webhook::cli::{Cli, Command};
use mpi_webhook::{certs, offline, serve, tls};

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
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
        Command::Reconcile(args) => {
            mpi_webhook::reconciler::run(args).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
