//! Every API Hira was built with, as data generated from `protocol/api/*.api`.
//!
//! The daemon admits a session only for an API described here, refuses frames whose
//! opcode names none of its functions and names the calls it forwards in its
//! records, without code for any API in particular: it asks [`describe`].

use hira_protocol::api::Description;
use hira_protocol::handshake::ApiId;

include!(concat!(env!("OUT_DIR"), "/descriptions.rs"));

/// The description of API `api`, if Hira was built with one.
pub fn describe(api: ApiId) -> Option<&'static Description> {
    DESCRIPTIONS.iter().find(|d| d.api == api)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_have_distinct_numbers_and_sorted_opcodes() {
        assert!(!DESCRIPTIONS.is_empty());
        for d in DESCRIPTIONS {
            assert_eq!(describe(d.api).map(|x| x.name), Some(d.name));
            assert!(
                d.ops.windows(2).all(|w| w[0].opcode < w[1].opcode),
                "{}",
                d.name
            );
            let first = d.ops[0];
            assert_eq!(d.op(first.opcode), Some(&first));
        }
        assert!(describe(ApiId(0)).is_none());
    }

    #[test]
    fn each_description_is_found_by_the_number_in_its_file() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../protocol/api");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
            let line = text
                .lines()
                .find(|l| l.starts_with("api "))
                .expect("a header");
            let words: Vec<&str> = line.split_whitespace().collect();
            let d = describe(ApiId(words[2].parse().unwrap())).expect("described");
            assert_eq!(d.name, words[1]);
            n += 1;
        }
        assert_eq!(n, DESCRIPTIONS.len());
    }
}
