//! The loader never panics and never loses a complete document to a broken neighbour.

use std::path::Path;

use nodeplane::snapshot::Kind;
use nodeplane::source::manifests::load_str;
use proptest::prelude::*;

fn ns_doc(i: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns-{i}\n  labels: {{team: t{i}}}\n"
    )
}

proptest! {
    #[test]
    fn arbitrary_yaml_ish_text_does_not_panic(
        text in r"((---|\.\.\.|apiVersion: v1|kind: (Pod|List|Namespace|EgressIP)|items:|- |metadata: \{name: x\}|\[|\]|\{|\}|:|'|#|\t| |\n|[a-z0-9]){0,40})"
    ) {
        let _ = load_str(Path::new("fuzz.yaml"), &text);
        let _ = load_str(Path::new("fuzz.json"), &text);
    }

    #[test]
    fn truncation_keeps_every_complete_document(n in 1usize..6, cut_fraction in 0.0f64..1.0) {
        let docs: Vec<String> = (0..n).map(ns_doc).collect();
        let text = docs.join("---\n");
        let cut = ((text.len() as f64) * cut_fraction) as usize;
        let truncated = &text[..cut];
        // A document is complete when the cut falls at its end or past its whole `---`
        // separator; a cut inside the separator leaves `-` or `--`, which is content.
        let mut end = 0;
        let mut complete = 0;
        for d in &docs {
            end += d.len();
            if cut == end || cut >= end + "---".len() {
                complete += 1;
            }
            end += "---\n".len();
        }
        let report = load_str(Path::new("cut.yaml"), truncated);
        let loaded = report.snapshot.count(Kind::Namespace);
        prop_assert!(loaded >= complete, "loaded {} < complete {}: {:?}", loaded, complete, report.problems);
        for i in 0..complete {
            let name = format!("ns-{i}");
            prop_assert!(report.snapshot.namespace(&name).is_some());
        }
    }
}
