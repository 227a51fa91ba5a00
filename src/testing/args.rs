//! Command-line options of the harness-less benches (`cargo bench --bench NAME -- --name N`).

/// The number after `name` on the command line, or `default`.
pub fn arg(name: &str, default: usize) -> usize {
    let argv: Vec<String> = std::env::args().collect();
    argv.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].parse().expect("a number"))
        .unwrap_or(default)
}
