//! The query messages a DBMS sends (docs/protocol.md §2), parsed.
//!
//! ```text
//! query := point | range
//! point := "P:" vid
//! range := "R:" term ( "&" term )*
//! term  := span ( "," span )*         the OR of its spans (they may overlap)
//! span  := vid | vid "-" vid          inclusive bounds, first <= second
//! vid   := 1*DIGIT                    decimal, fits in u64
//! ```
//!
//! Spaces, tabs, CR and LF are allowed before and after the whole message and
//! nowhere else; leading zeros are allowed. Every error names the 0-based
//! byte offset into the message as sent and what was expected there.
//!
//! ```
//! use bitfold_proto::query::{parse, Limits, Query, Span, Term};
//!
//! let q = parse(b" R:1-5,9&007\n", &Limits::default()).unwrap();
//! let span = |first, last| Span { first, last };
//! assert_eq!(
//!     q,
//!     Query::Range(vec![
//!         Term { spans: vec![span(1, 5), span(9, 9)] },
//!         Term { spans: vec![span(7, 7)] },
//!     ])
//! );
//! let e = parse(b"R:1-x", &Limits::default()).unwrap_err();
//! assert_eq!(e.to_string(), "bad query at byte 4: expected a digit after '-'");
//! ```

use std::fmt;

/// Size limits on a query message; never unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest message accepted, in bytes as sent (default 1 MiB).
    pub max_bytes: usize,
    /// The most terms a range query may have (default 10,000).
    pub max_terms: usize,
    /// The most spans a range query may have in all its terms (default 10,000).
    pub max_spans: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 1 << 20,
            max_terms: 10_000,
            max_spans: 10_000,
        }
    }
}

/// A parsed query message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// `P:vid`: the vector `vid`.
    Point(u64),
    /// `R:t1&t2&...`: the AND over the terms of the OR of the vectors in each.
    Range(Vec<Term>),
}

/// One term of a range query: the OR of the vectors in its spans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// The spans as written (at least one; they may overlap).
    pub spans: Vec<Span>,
}

/// The vids `first..=last` of a term: a run of vids, as the slaves read them.
pub use bitfold_engine::VidRun as Span;

impl Term {
    /// The term's spans sorted, with overlapping and adjacent ones merged:
    /// the same vids, each named once, ascending.
    pub fn merged(&self) -> Vec<Span> {
        Span::merged(self.spans.clone())
    }
}

impl fmt::Display for Query {
    /// The canonical message: no whitespace, no leading zeros, `a` for `a-a`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Query::Point(vid) => write!(f, "P:{vid}"),
            Query::Range(terms) => {
                f.write_str("R:")?;
                for (i, term) in terms.iter().enumerate() {
                    if i > 0 {
                        f.write_str("&")?;
                    }
                    for (j, span) in term.spans.iter().enumerate() {
                        if j > 0 {
                            f.write_str(",")?;
                        }
                        if span.first == span.last {
                            write!(f, "{}", span.first)?;
                        } else {
                            write!(f, "{}-{}", span.first, span.last)?;
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// A malformed query message: where, and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad query at byte {offset}: {expected}")]
pub struct ParseError {
    /// 0-based byte offset into the message as sent.
    pub offset: usize,
    /// What was expected at `offset`, or what is wrong there.
    pub expected: String,
}

fn error(offset: usize, expected: impl Into<String>) -> ParseError {
    ParseError {
        offset,
        expected: expected.into(),
    }
}

fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\r' | b'\n')
}

/// Parses a query message (bytes as sent: the text need not be UTF-8 to be rejected well).
pub fn parse(message: &[u8], limits: &Limits) -> Result<Query, ParseError> {
    if message.len() > limits.max_bytes {
        return Err(error(
            limits.max_bytes,
            format!("the message is longer than {} bytes", limits.max_bytes),
        ));
    }
    let start = message
        .iter()
        .position(|&b| !is_space(b))
        .unwrap_or(message.len());
    let end = message
        .iter()
        .rposition(|&b| !is_space(b))
        .map_or(start, |i| i + 1);
    let mut cursor = Cursor {
        bytes: &message[..end],
        at: start,
        dashed: false,
    };
    let kind = cursor.peek();
    if !matches!(kind, Some(b'P' | b'R')) {
        return Err(cursor.expected("`P:` (point query) or `R:` (range query)"));
    }
    cursor.at += 1;
    if cursor.peek() != Some(b':') {
        let letter = char::from(kind.unwrap_or_default());
        return Err(cursor.expected(format!("':' after '{letter}'")));
    }
    cursor.at += 1;
    if kind == Some(b'P') {
        let vid = cursor.vid("a digit (the vid)")?;
        return match cursor.peek() {
            None => Ok(Query::Point(vid)),
            Some(_) => Err(cursor.expected("a digit or the end of the message")),
        };
    }
    let mut terms = Vec::new();
    let mut spans_in_all = 0;
    loop {
        if terms.len() == limits.max_terms {
            return Err(error(
                cursor.at,
                format!("a query has at most {} terms", limits.max_terms),
            ));
        }
        let mut spans = Vec::new();
        loop {
            if spans_in_all == limits.max_spans {
                return Err(error(
                    cursor.at,
                    format!("a query has at most {} spans in all", limits.max_spans),
                ));
            }
            let what = if spans.is_empty() {
                "a digit (the first vid of a term)"
            } else {
                "a digit (the first vid of a span)"
            };
            spans.push(cursor.span(what)?);
            spans_in_all += 1;
            if cursor.peek() != Some(b',') {
                break;
            }
            cursor.at += 1;
        }
        terms.push(Term { spans });
        match cursor.peek() {
            None => return Ok(Query::Range(terms)),
            Some(b'&') => cursor.at += 1,
            Some(_) if cursor.dashed => {
                return Err(cursor.expected("a digit, ',', '&' or the end of the message"));
            }
            Some(_) => {
                return Err(cursor.expected("a digit, '-', ',', '&' or the end of the message"));
            }
        }
    }
}

struct Cursor<'m> {
    /// The message up to its trailing whitespace.
    bytes: &'m [u8],
    at: usize,
    /// Whether the last span read was `vid-vid` (what may follow it differs).
    dashed: bool,
}

impl Cursor<'_> {
    /// Reads a span: `vid` or `vid-vid`, first <= second; `what` says
    /// what a missing first digit should have been.
    fn span(&mut self, what: &str) -> Result<Span, ParseError> {
        let start = self.at;
        let first = self.vid(what)?;
        if self.peek() != Some(b'-') {
            self.dashed = false;
            return Ok(Span { first, last: first });
        }
        self.at += 1;
        let last = self.vid("a digit after '-'")?;
        if first > last {
            return Err(error(
                start,
                format!(
                    "range {first}-{last} is reversed: the first vid must not exceed the second"
                ),
            ));
        }
        self.dashed = true;
        Ok(Span { first, last })
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn expected(&self, what: impl fmt::Display) -> ParseError {
        error(self.at, format!("expected {what}"))
    }

    /// Reads a decimal vid; `what` says what a missing digit should have been.
    fn vid(&mut self, what: &str) -> Result<u64, ParseError> {
        let start = self.at;
        let digits = self.bytes[start..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return Err(self.expected(what));
        }
        let mut value: u64 = 0;
        for &digit in &self.bytes[start..start + digits] {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(digit - b'0')))
                .ok_or_else(|| {
                    error(
                        start,
                        format!("vid does not fit in 64 bits (the largest is {})", u64::MAX),
                    )
                })?;
        }
        self.at = start + digits;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse_default(message: &str) -> Result<Query, ParseError> {
        parse(message.as_bytes(), &Limits::default())
    }

    fn term(first: u64, last: u64) -> Term {
        Term {
            spans: vec![Span { first, last }],
        }
    }

    #[track_caller]
    fn fails_at(message: &str, offset: usize, expected: &str) {
        let err = parse_default(message).expect_err(message);
        assert_eq!(
            (err.offset, err.expected.as_str()),
            (offset, expected),
            "{message:?}"
        );
    }

    #[test]
    fn points_and_ranges() {
        assert_eq!(parse_default("P:7"), Ok(Query::Point(7)));
        assert_eq!(parse_default("P:007"), Ok(Query::Point(7)));
        assert_eq!(
            parse_default("P:18446744073709551615"),
            Ok(Query::Point(u64::MAX))
        );
        assert_eq!(
            parse_default("R:0-18446744073709551615"),
            Ok(Query::Range(vec![term(0, u64::MAX)]))
        );
        assert_eq!(
            parse_default("R:3&1-2&3&5-5"),
            Ok(Query::Range(vec![
                term(3, 3),
                term(1, 2),
                term(3, 3),
                term(5, 5)
            ]))
        );
        assert_eq!(
            parse_default("R:00-0000000000000000000000018446744073709551615"),
            Ok(Query::Range(vec![term(0, u64::MAX)]))
        );
    }

    #[test]
    fn whitespace_only_around_the_message() {
        assert_eq!(parse_default(" \t\r\nP:1\r\n\t "), Ok(Query::Point(1)));
        fails_at("P: 1", 2, "expected a digit (the vid)");
        fails_at("P :1", 1, "expected ':' after 'P'");
        fails_at(
            " R:1 &2",
            4,
            "expected a digit, '-', ',', '&' or the end of the message",
        );
        fails_at("R:1& 2", 4, "expected a digit (the first vid of a term)");
        fails_at("R:1- 2", 4, "expected a digit after '-'");
        fails_at(
            "\u{c}P:1",
            0,
            "expected `P:` (point query) or `R:` (range query)",
        );
        fails_at("P:1\u{b}", 3, "expected a digit or the end of the message");
    }

    #[test]
    fn every_error_names_its_offset() {
        fails_at("", 0, "expected `P:` (point query) or `R:` (range query)");
        fails_at(
            "  \n",
            3,
            "expected `P:` (point query) or `R:` (range query)",
        );
        fails_at(
            "p:1",
            0,
            "expected `P:` (point query) or `R:` (range query)",
        );
        fails_at(
            "Q:1",
            0,
            "expected `P:` (point query) or `R:` (range query)",
        );
        fails_at("P", 1, "expected ':' after 'P'");
        fails_at("R;1", 1, "expected ':' after 'R'");
        fails_at("P:", 2, "expected a digit (the vid)");
        fails_at("P:-1", 2, "expected a digit (the vid)");
        fails_at("P:12x", 4, "expected a digit or the end of the message");
        fails_at("P:1-2", 3, "expected a digit or the end of the message");
        fails_at("P:1&2", 3, "expected a digit or the end of the message");
        fails_at("R:", 2, "expected a digit (the first vid of a term)");
        fails_at("R:&1", 2, "expected a digit (the first vid of a term)");
        fails_at("R:1&", 4, "expected a digit (the first vid of a term)");
        fails_at("R:1&&2", 4, "expected a digit (the first vid of a term)");
        fails_at("R:1-", 4, "expected a digit after '-'");
        fails_at("R:1-x", 4, "expected a digit after '-'");
        fails_at("R:1--2", 4, "expected a digit after '-'");
        fails_at(
            "R:1;2",
            3,
            "expected a digit, '-', ',', '&' or the end of the message",
        );
        fails_at(
            "R:1-2-3",
            5,
            "expected a digit, ',', '&' or the end of the message",
        );
        fails_at(
            "R:1-2x",
            5,
            "expected a digit, ',', '&' or the end of the message",
        );
        fails_at(
            "R:1&9-3",
            4,
            "range 9-3 is reversed: the first vid must not exceed the second",
        );
        let too_big = "vid does not fit in 64 bits (the largest is 18446744073709551615)";
        fails_at("P:18446744073709551616", 2, too_big);
        fails_at("R:5&1-99999999999999999999999", 6, too_big);
        fails_at("R:00018446744073709551616-1", 2, too_big);
    }

    #[test]
    fn non_ascii_bytes_are_errors_not_panics() {
        let err = parse(b"R:1\xff", &Limits::default()).unwrap_err();
        assert_eq!(err.offset, 3);
        let err = parse("P:١".as_bytes(), &Limits::default()).unwrap_err();
        assert_eq!(err.offset, 2);
    }

    #[test]
    fn a_term_is_the_or_of_its_spans() {
        let span = |first, last| Span { first, last };
        assert_eq!(
            parse_default("R:200,202&130-139"),
            Ok(Query::Range(vec![
                Term {
                    spans: vec![span(200, 200), span(202, 202)]
                },
                term(130, 139),
            ]))
        );
        let overlapping = Term {
            spans: vec![
                span(5, 9),
                span(1, 2),
                span(3, 4),
                span(8, 20),
                span(30, 30),
            ],
        };
        assert_eq!(overlapping.merged(), vec![span(1, 20), span(30, 30)]);
        let at_the_end = Term {
            spans: vec![span(u64::MAX, u64::MAX), span(0, u64::MAX)],
        };
        assert_eq!(at_the_end.merged(), vec![span(0, u64::MAX)]);
        fails_at("R:1,", 4, "expected a digit (the first vid of a span)");
        fails_at("R:1,&2", 4, "expected a digit (the first vid of a span)");
        fails_at(
            "R:1-2,3x",
            7,
            "expected a digit, '-', ',', '&' or the end of the message",
        );
        fails_at(
            "R:1-2,3-4x",
            9,
            "expected a digit, ',', '&' or the end of the message",
        );
        fails_at(
            "R:1,5-3",
            4,
            "range 5-3 is reversed: the first vid must not exceed the second",
        );
        assert_eq!(
            parse_default(" R:7-8,1&2 ").unwrap().to_string(),
            "R:7-8,1&2"
        );
    }

    #[test]
    fn limits_are_enforced_and_configurable() {
        let limits = Limits {
            max_bytes: 10,
            max_terms: 3,
            max_spans: 3,
        };
        assert!(parse(b"R:1&2&3", &limits).is_ok());
        let err = parse(b"R:1&2&3&4", &limits).unwrap_err();
        assert_eq!(
            (err.offset, err.expected.as_str()),
            (8, "a query has at most 3 terms")
        );
        assert!(parse(b"R:1,2&3", &limits).is_ok());
        let err = parse(b"R:1,2&3,4", &limits).unwrap_err();
        assert_eq!(
            (err.offset, err.expected.as_str()),
            (8, "a query has at most 3 spans in all")
        );
        assert!(parse(b"P:12345678", &limits).is_ok());
        let err = parse(b"P:123456789", &limits).unwrap_err();
        assert_eq!(
            (err.offset, err.expected.as_str()),
            (10, "the message is longer than 10 bytes")
        );

        let defaults = Limits::default();
        let mut long = b"R:".to_vec();
        long.extend(std::iter::repeat_n(b'0', (1 << 20) - 3));
        long.push(b'1');
        assert_eq!(parse(&long, &defaults), Ok(Query::Range(vec![term(1, 1)])));
        long.push(b' ');
        assert_eq!(parse(&long, &defaults).unwrap_err().offset, 1 << 20);
        let many = format!("R:{}", vec!["1"; 10_001].join("&"));
        assert_eq!(
            parse(many.as_bytes(), &defaults).unwrap_err().offset,
            2 + 2 * 10_000
        );
        let most = format!("R:{}", vec!["1"; 10_000].join("&"));
        assert!(parse(most.as_bytes(), &defaults).is_ok());
    }

    #[test]
    fn errors_display_as_one_line() {
        let err = parse_default("R:1-x").unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad query at byte 4: expected a digit after '-'"
        );
    }

    fn any_query() -> impl Strategy<Value = Query> {
        let vid = prop_oneof![any::<u64>(), 0..20u64, (u64::MAX - 20)..=u64::MAX];
        let span = (vid.clone(), vid.clone()).prop_map(|(a, b)| Span {
            first: a.min(b),
            last: a.max(b),
        });
        let term = proptest::collection::vec(span, 1..4).prop_map(|spans| Term { spans });
        prop_oneof![
            vid.prop_map(Query::Point),
            proptest::collection::vec(term, 1..20).prop_map(Query::Range),
        ]
    }

    /// Renders `query` with some leading zeros and surrounding whitespace.
    fn render(query: &Query, zeros: &[usize], space: &str) -> String {
        let mut zeros = zeros.iter().cycle();
        let mut vid = |v: u64| format!("{}{v}", "0".repeat(*zeros.next().unwrap()));
        let body = match query {
            Query::Point(v) => format!("P:{}", vid(*v)),
            Query::Range(terms) => {
                let terms: Vec<String> = terms
                    .iter()
                    .map(|t| {
                        let spans: Vec<String> = t
                            .spans
                            .iter()
                            .map(|s| {
                                if s.first == s.last {
                                    vid(s.first)
                                } else {
                                    format!("{}-{}", vid(s.first), vid(s.last))
                                }
                            })
                            .collect();
                        spans.join(",")
                    })
                    .collect();
                format!("R:{}", terms.join("&"))
            }
        };
        format!("{space}{body}{space}")
    }

    proptest! {
        #[test]
        fn valid_queries_parse_to_themselves(
            query in any_query(),
            zeros in proptest::collection::vec(0..3usize, 1..5),
            space in "[ \t\r\n]{0,3}",
        ) {
            let message = render(&query, &zeros, &space);
            prop_assert_eq!(parse_default(&message), Ok(query.clone()));
            prop_assert_eq!(parse_default(&query.to_string()), Ok(query));
        }

        #[test]
        fn no_input_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Err(err) = parse(&bytes, &Limits::default()) {
                prop_assert!(err.offset <= bytes.len());
            }
        }

        #[test]
        fn near_valid_input_never_panics(message in "[ PR:0-9&\\-x]{0,40}") {
            if let Err(err) = parse_default(&message) {
                prop_assert!(err.offset <= message.len());
            }
        }
    }
}
