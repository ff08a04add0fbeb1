//! Regressions found by the `redact` fuzz target (agent/fuzz): `sanitize`
//! must be idempotent even when a mask joins text that a rule reads
//! differently on a second pass.

use kyverno_runtime_report::sanitize;

/// The input the fuzzer found: the first pass masked `passs:` as a
/// `key: value` and so left `aaa://u0er:passs:***;h@host`, a URL userinfo
/// the second pass masked. Both passes now happen in one call.
#[test]
fn a_mask_that_completes_a_url_userinfo_is_settled() {
    let input = "redsli.c\0-aaaaaaaaaaaaaaa://u0er:passs://u0er:pass@host@host/patccccccccc5/@patcccaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaXaaaau:p-;h@host:ccar:sstccccscccccurl\0-uu:p\0\u{1}\0\0\0\0\0\0\0httpscccccc^cccccc cccc(ccc://xcccccccccccccccccccccacccccccc5433/dcccccccnccc";
    let once = sanitize(input);
    assert_eq!(sanitize(&once), once, "{input:?}");
    assert!(!once.contains("u0er:passs"), "{once:?}");
}
