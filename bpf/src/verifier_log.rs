//! Reading a verifier log: pure text, so it works in stub builds too.

/// The verifier's own reason in a load log: the last non-empty line before
/// its "processed N insns" summary, trimmed (e.g. "helper call is not
/// allowed in probe", 5.10 refusing `bpf_d_path` in an LSM program).
/// `None` when the log has no summary (libbpf failed before the verifier).
pub fn verifier_reason(log: &str) -> Option<&str> {
    let lines: Vec<&str> = log.lines().collect();
    let at = lines.iter().position(|l| l.starts_with("processed "))?;
    lines[..at]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::verifier_reason;

    #[test]
    fn the_verifier_reason_is_the_line_before_its_summary() {
        let log = "44: (85) call bpf_d_path#147\n  helper call is not allowed in probe  \n\n\
                   processed 41 insns (limit 1000000)\n-- END PROG LOAD LOG --\n";
        assert_eq!(
            verifier_reason(log),
            Some("helper call is not allowed in probe")
        );
        assert_eq!(verifier_reason("libbpf: no log\n"), None);
    }
}
