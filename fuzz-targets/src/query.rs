use bitfold_proto::query::{Limits, Query, parse};

/// The query parser: a parsed message prints as a message that parses to
/// the same query; an error's offset lies inside the message.
pub fn query(data: &[u8]) {
    let limits = Limits {
        max_bytes: 4096,
        max_terms: 64,
        max_spans: 256,
    };
    match parse(data, &limits) {
        Ok(query) => {
            let printed = query.to_string();
            let again = parse(printed.as_bytes(), &limits)
                .unwrap_or_else(|e| panic!("{query:?} printed as {printed:?}, which fails: {e}"));
            assert_eq!(again, query, "printed as {printed:?}");
            if let Query::Range(terms) = &query {
                assert!(terms.iter().all(|t| !t.spans.is_empty()));
                assert!(
                    terms
                        .iter()
                        .flat_map(|t| &t.spans)
                        .all(|s| s.first <= s.last)
                );
            }
        }
        Err(e) => assert!(
            e.offset <= data.len(),
            "offset {} past a {}-byte message: {e}",
            e.offset,
            data.len()
        ),
    }
}
