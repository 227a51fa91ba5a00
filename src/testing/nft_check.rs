//! `nft -c -f -` in a private network namespace: the kernel checks the text, nothing changes.
//! For the tests that prove rendered text is valid nft.

use std::io::Write;
use std::process::{Command, Stdio};

/// Panics with nft's message (and the text) when the kernel would reject `text`, and when not
/// root: such a test must fail, never pass without checking.
pub fn nft_check(text: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test checks the ruleset with the kernel and needs root (scripts/test.sh) or root of a user namespace (scripts/test-unprivileged.sh)"
    );
    let mut child = Command::new("unshare")
        .args(["--net", "nft", "-c", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run unshare + nft (util-linux and nftables must be installed)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to nft");
    let out = child.wait_with_output().expect("wait for nft");
    assert!(
        out.status.success(),
        "nft -c rejected the text:\n{}\n---\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}
