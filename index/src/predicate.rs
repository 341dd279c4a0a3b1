//! Predicates: conjunctions of conditions on columns, parsed with the byte
//! offset of every part so that errors can point at it.
//!
//! ```text
//! predicate := condition ( AND condition )*
//! condition := column op literal
//!            | column IN "(" literal ( "," literal )* ")"
//!            | column BETWEEN literal AND literal       (inclusive)
//! op        := "=" | "<" | "<=" | ">" | ">="
//! column    := name | '"' any text but '"' '"'
//! literal   := number | "'" text, '' for a quote "'"
//! ```
//! Keywords are matched in any case; a name is letters, digits and `_`,
//! not starting with a digit.

use std::fmt;

/// A parsed predicate: the AND of its conditions.
#[derive(Debug, Clone, PartialEq)]
pub struct Predicate {
    /// The conditions, in the order written.
    pub conditions: Vec<Condition>,
}

/// One condition on one column.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// The column named.
    pub column: String,
    /// Byte offset of the column's name.
    pub offset: usize,
    /// The test on the column's cells.
    pub test: Test,
    /// The condition as written.
    pub text: String,
}

/// What a condition asks of a cell.
#[derive(Debug, Clone, PartialEq)]
pub enum Test {
    /// `op literal`.
    Compare(Op, Literal),
    /// `IN (literal, ...)`.
    In(Vec<Literal>),
    /// `BETWEEN low AND high`, both inclusive.
    Between(Literal, Literal),
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `=`
    Eq,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// A value in a predicate, with its byte offset.
#[derive(Debug, Clone, PartialEq)]
pub struct Literal {
    /// The value.
    pub value: Value,
    /// Byte offset where it starts.
    pub offset: usize,
}

/// A number (written bare) or a text (in single quotes).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A number.
    Number(f64),
    /// A text.
    Text(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Number(n) => write!(f, "{n}"),
            Value::Text(t) => write!(f, "'{}'", t.replace('\'', "''")),
        }
    }
}

/// Why a predicate cannot be answered through the index.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("bad predicate at byte {offset}: {problem}")]
pub struct PredicateError {
    /// 0-based byte offset into the predicate as given.
    pub offset: usize,
    /// What is wrong there, and what to do.
    pub problem: String,
}

impl PredicateError {
    pub(crate) fn at(offset: usize, problem: impl Into<String>) -> PredicateError {
        PredicateError {
            offset,
            problem: problem.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Name(String),
    Quoted(String),
    Number(f64),
    Text(String),
    Op(Op),
    Open,
    Close,
    Comma,
    End,
}

impl Token {
    fn keyword(&self, word: &str) -> bool {
        matches!(self, Token::Name(name) if name.eq_ignore_ascii_case(word))
    }

    fn describe(&self) -> String {
        match self {
            Token::Name(n) => format!("`{n}`"),
            Token::Quoted(n) => format!("\"{n}\""),
            Token::Number(n) => format!("the number {n}"),
            Token::Text(t) => format!("the text '{t}'"),
            Token::Op(_) => "an operator".into(),
            Token::Open => "`(`".into(),
            Token::Close => "`)`".into(),
            Token::Comma => "`,`".into(),
            Token::End => "the end".into(),
        }
    }
}

fn tokens(text: &str) -> Result<Vec<(usize, Token)>, PredicateError> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        let c = bytes[i];
        let token = match c {
            b' ' | b'\t' | b'\r' | b'\n' => {
                i += 1;
                continue;
            }
            b'(' => Token::Open,
            b')' => Token::Close,
            b',' => Token::Comma,
            b'=' => Token::Op(Op::Eq),
            b'<' | b'>' => {
                let equal = bytes.get(i + 1) == Some(&b'=');
                if equal {
                    i += 1;
                }
                Token::Op(match (c, equal) {
                    (b'<', false) => Op::Lt,
                    (b'<', true) => Op::Le,
                    (_, false) => Op::Gt,
                    (_, true) => Op::Ge,
                })
            }
            b'\'' => {
                let mut value = String::new();
                let mut j = i + 1;
                loop {
                    let Some(rel) = text[j..].find('\'') else {
                        return Err(PredicateError::at(
                            start,
                            "this text has no closing quote `'` (write '' for a quote inside it)",
                        ));
                    };
                    value.push_str(&text[j..j + rel]);
                    j += rel + 1;
                    if bytes.get(j) == Some(&b'\'') {
                        value.push('\'');
                        j += 1;
                    } else {
                        break;
                    }
                }
                i = j;
                out.push((start, Token::Text(value)));
                continue;
            }
            b'"' => {
                let Some(rel) = text[i + 1..].find('"') else {
                    return Err(PredicateError::at(
                        start,
                        "this column name has no closing quote `\"`",
                    ));
                };
                let name = text[i + 1..i + 1 + rel].to_string();
                i += rel + 2;
                out.push((start, Token::Quoted(name)));
                continue;
            }
            b'-' | b'+' | b'.' | b'0'..=b'9' => {
                let mut j = i + 1;
                while j < bytes.len()
                    && (bytes[j].is_ascii_digit()
                        || bytes[j] == b'.'
                        || matches!(bytes[j], b'e' | b'E')
                        || (matches!(bytes[j], b'-' | b'+') && matches!(bytes[j - 1], b'e' | b'E')))
                {
                    j += 1;
                }
                let number = &text[i..j];
                let value = number
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| {
                        PredicateError::at(start, format!("`{number}` is not a number"))
                    })?;
                i = j;
                out.push((start, Token::Number(value + 0.0)));
                continue;
            }
            c if c == b'_' || c.is_ascii_alphabetic() => {
                let mut j = i + 1;
                while j < bytes.len() && (bytes[j] == b'_' || bytes[j].is_ascii_alphanumeric()) {
                    j += 1;
                }
                let name = text[i..j].to_string();
                i = j;
                out.push((start, Token::Name(name)));
                continue;
            }
            _ => {
                let c = text[i..].chars().next().expect("inside the text");
                return Err(PredicateError::at(
                    start,
                    format!(
                        "unexpected `{c}`: write a column, an operator (= < <= > >=), IN, BETWEEN, AND, \
                         a number, or a 'text' in single quotes (a column name with other characters in \"double quotes\")"
                    ),
                ));
            }
        };
        i += 1;
        out.push((start, token));
    }
    out.push((text.len(), Token::End));
    Ok(out)
}

struct Parser<'a> {
    text: &'a str,
    tokens: Vec<(usize, Token)>,
    next: usize,
}

impl Parser<'_> {
    fn peek(&self) -> &(usize, Token) {
        &self.tokens[self.next]
    }

    fn take(&mut self) -> (usize, Token) {
        let token = self.tokens[self.next].clone();
        if token.1 != Token::End {
            self.next += 1;
        }
        token
    }

    fn expected(&self, what: &str) -> PredicateError {
        let (offset, token) = self.peek();
        PredicateError::at(
            *offset,
            format!("expected {what}, found {}", token.describe()),
        )
    }

    fn condition(&mut self) -> Result<Condition, PredicateError> {
        let (offset, column) = match &self.peek().1 {
            Token::Quoted(name) => (self.peek().0, name.clone()),
            Token::Name(name)
                if !["and", "in", "between"]
                    .iter()
                    .any(|k| name.eq_ignore_ascii_case(k)) =>
            {
                (self.peek().0, name.clone())
            }
            _ => return Err(self.expected("a column name")),
        };
        self.take();
        let test = match self.peek().1.clone() {
            Token::Op(op) => {
                self.take();
                Test::Compare(op, self.literal()?)
            }
            t if t.keyword("in") => {
                self.take();
                if self.peek().1 != Token::Open {
                    return Err(self.expected("`(` after IN"));
                }
                self.take();
                let mut values = vec![self.literal()?];
                while self.peek().1 == Token::Comma {
                    self.take();
                    values.push(self.literal()?);
                }
                if self.peek().1 != Token::Close {
                    return Err(self.expected("`,` or `)` in the IN list"));
                }
                self.take();
                Test::In(values)
            }
            t if t.keyword("between") => {
                self.take();
                let low = self.literal()?;
                if !self.peek().1.keyword("and") {
                    return Err(self.expected("AND between the bounds of BETWEEN"));
                }
                self.take();
                Test::Between(low, self.literal()?)
            }
            _ => {
                return Err(self.expected(&format!(
                    "=, <, <=, >, >=, IN or BETWEEN after the column `{column}`"
                )));
            }
        };
        let end = self.peek().0;
        let text = self.text[offset..end].trim_end().to_string();
        Ok(Condition {
            column,
            offset,
            test,
            text,
        })
    }

    fn literal(&mut self) -> Result<Literal, PredicateError> {
        let value = match &self.peek().1 {
            Token::Number(n) => Value::Number(*n),
            Token::Text(t) => Value::Text(t.clone()),
            Token::Name(_) => {
                return Err(self.expected("a number, or a text in single quotes ('North')"));
            }
            _ => return Err(self.expected("a number or a 'text'")),
        };
        let (offset, _) = self.take();
        Ok(Literal { value, offset })
    }
}

impl Predicate {
    /// Parses a predicate.
    pub fn parse(text: &str) -> Result<Predicate, PredicateError> {
        let mut parser = Parser {
            text,
            tokens: tokens(text)?,
            next: 0,
        };
        let mut conditions = vec![parser.condition()?];
        loop {
            match &parser.peek().1 {
                Token::End => break,
                t if t.keyword("and") => {
                    parser.take();
                    conditions.push(parser.condition()?);
                }
                _ => {
                    return Err(parser.expected("AND or the end (only AND joins conditions)"));
                }
            }
        }
        Ok(Predicate { conditions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_parse_with_their_offsets() {
        let p = Predicate::parse(
            "age >= 30 and Age<40 AND region IN ('North', 'O''Neil') AND \"last purchase\" BETWEEN -1.5 AND 2e3",
        )
        .unwrap();
        let columns: Vec<(&str, usize)> = p
            .conditions
            .iter()
            .map(|c| (c.column.as_str(), c.offset))
            .collect();
        assert_eq!(
            columns,
            [
                ("age", 0),
                ("Age", 14),
                ("region", 25),
                ("last purchase", 60)
            ]
        );
        assert_eq!(p.conditions[1].text, "Age<40");
        assert_eq!(
            p.conditions[0].test,
            Test::Compare(
                Op::Ge,
                Literal {
                    value: Value::Number(30.0),
                    offset: 7
                }
            )
        );
        let Test::In(values) = &p.conditions[2].test else {
            panic!()
        };
        assert_eq!(values[1].value, Value::Text("O'Neil".into()));
        assert_eq!(values[1].offset, 45);
        let Test::Between(low, high) = &p.conditions[3].test else {
            panic!()
        };
        assert_eq!(
            (low.value.clone(), high.value.clone()),
            (Value::Number(-1.5), Value::Number(2000.0))
        );
    }

    #[test]
    fn mistakes_are_reported_at_their_byte() {
        let cases = [
            ("", 0, "expected a column name, found the end"),
            (
                "age",
                3,
                "expected =, <, <=, >, >=, IN or BETWEEN after the column `age`",
            ),
            ("age < ", 6, "expected a number or a 'text'"),
            ("region = North", 9, "a number, or a text in single quotes"),
            ("region = 'North", 9, "no closing quote"),
            ("age < 3 OR age > 5", 8, "expected AND or the end"),
            ("age IN 3", 7, "expected `(` after IN"),
            ("age IN (3 4)", 10, "expected `,` or `)`"),
            ("age BETWEEN 3 OR 4", 14, "expected AND between"),
            ("age ! 3", 4, "unexpected `!`"),
            ("age < 1.2.3", 6, "`1.2.3` is not a number"),
            ("age < 3 AND", 11, "expected a column name"),
            ("\"age < 3", 0, "no closing quote"),
        ];
        for (text, offset, says) in cases {
            let err = Predicate::parse(text).unwrap_err();
            assert_eq!(err.offset, offset, "{text}: {err}");
            assert!(err.problem.contains(says), "{text}: {err}");
        }
    }
}
