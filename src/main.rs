//! `agent`: parse the command line, set up logging, run the chosen mode.

use clap::Parser;
use nodeplane::cli::{Cli, Command};
use nodeplane::config::Config;
use nodeplane::{app, reconcile};
use std::io::IsTerminal;
use std::process::ExitCode;

fn main() -> ExitCode {
    nodeplane::heap::limit_arenas();
    let cli = Cli::parse();
    let config = match Config::resolve(&cli.opts) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agent: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&config.log_level);
    match run(&cli, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli, config: Config) -> anyhow::Result<()> {
    if let Some(Command::Cleanup) = cli.command {
        return Ok(reconcile::cleanup(&config)?);
    }
    if let Some(Command::Assigner) = cli.command {
        return Ok(tokio_runtime()?.block_on(app::assigner::run(config))?);
    }
    if let Some(Command::Explain(args)) = &cli.command {
        return explain(&config, args);
    }
    if cli.opts.dry_run {
        print!("{}", reconcile::dry_run(&config)?);
        return Ok(());
    }
    if cli.opts.once {
        let answerer = nodeplane::dns::ResolveOnce(config.resolv_conf.clone());
        return Ok(reconcile::once(&config, answerer)?);
    }
    Ok(tokio_runtime()?.block_on(app::run(config))?)
}

/// `agent explain`: prints the report; exit status 0 whatever the verdict.
fn explain(config: &Config, args: &nodeplane::cli::ExplainArgs) -> anyhow::Result<()> {
    use nodeplane::explain::{offline, output};
    let req = offline::Request {
        src: Some(args.src),
        dst: Some(args.dst),
        proto: args.proto.clone(),
        sport: args.sport,
        dport: args.dport,
        iif: args.iif.clone(),
        oif: args.oif.clone(),
        ct_state: args.ct_state.clone(),
        bridged: args.bridged,
        br_netfilter: args.br_netfilter,
        local_addrs: args.local_addrs.clone(),
        trace: args
            .trace
            .map(|s| offline::TraceLimits::new(s, args.trace_packets))
            .transpose()?,
    };
    if args.live {
        let json = args.output == "json";
        let answer = nodeplane::explain::live::ask(config.admin_address, &req, json)?;
        print!("{answer}");
        return Ok(());
    }
    req.query()?;
    let (snapshot, desired, _) = reconcile::planned(config)?;
    let report = offline::explain_desired(&config.node_name, &snapshot, &desired, &req)?;
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", output::text(&report));
    }
    Ok(())
}

fn tokio_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// Logs go to stderr so that `--dry-run` output on stdout stays a clean ruleset; one event is
/// one line whatever names it quotes (`text::LogWriter`).
fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || nodeplane::text::LogWriter::new(std::io::stderr(), ansi))
        .with_ansi(ansi)
        .init();
}
