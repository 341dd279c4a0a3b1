//! A table's cells: trimmed, and read as numbers the way `str::parse`
//! reads them, the common short decimals fast.

/// Cell `i` of a record, without the spaces around it.
pub(crate) fn cell(record: &csv::ByteRecord, i: usize) -> &[u8] {
    record[i].trim_ascii()
}

/// Powers of ten that are exact in an `f64`.
const EXACT_TENS: [f64; 16] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
];

/// A cell read as a number: the value and whether it is an exact integer.
pub(crate) fn parse_number(cell: &[u8]) -> Option<(f64, bool)> {
    if let Some(value) = parse_short_decimal(cell) {
        // Adding 0.0 turns -0.0 into 0.0: one value, one vector.
        let value = value + 0.0;
        return Some((value, value.fract() == 0.0));
    }
    let value: f64 = std::str::from_utf8(cell).ok()?.parse().ok()?;
    if !value.is_finite() || cell.iter().any(u8::is_ascii_alphabetic) && !is_exponent(cell) {
        return None;
    }
    let value = value + 0.0;
    Some((value, value.fract() == 0.0 && value.abs() < 9.0e15))
}

/// The common case, read fast: `-?digits(.digits)?` with at most 15
/// digits. The digits as an integer are exact in an `f64`, and so is the
/// power of ten, so their quotient is the correctly rounded value, the same
/// as `str::parse` gives.
fn parse_short_decimal(cell: &[u8]) -> Option<f64> {
    let (negative, rest) = match cell.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, cell),
    };
    let (whole, fraction) = match rest.iter().position(|&c| c == b'.') {
        Some(dot) => (&rest[..dot], &rest[dot + 1..]),
        None => (rest, &rest[rest.len()..]),
    };
    let digits = whole.len() + fraction.len();
    if whole.is_empty() || digits > 15 || (fraction.is_empty() && whole.len() < rest.len()) {
        return None;
    }
    let mut mantissa = 0u64;
    for &c in whole.iter().chain(fraction) {
        if !c.is_ascii_digit() {
            return None;
        }
        mantissa = mantissa * 10 + u64::from(c - b'0');
    }
    let value = mantissa as f64 / EXACT_TENS[fraction.len()];
    Some(if negative { -value } else { value })
}

/// `1e5`, `2.5E-3`: the only letters a number may hold.
fn is_exponent(cell: &[u8]) -> bool {
    cell.iter()
        .filter(|c| c.is_ascii_alphabetic())
        .all(|&c| c == b'e' || c == b'E')
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn numbers_read_fast_are_the_numbers_str_parse_reads(
            text in "-?[0-9]{1,12}(\\.[0-9]{0,8})?|-?\\.[0-9]{1,4}|[0-9]{1,3}[eE]-?[0-9]"
        ) {
            let expected: f64 = text.parse().unwrap();
            let (value, integer) = parse_number(text.as_bytes()).unwrap();
            proptest::prop_assert_eq!(value.to_bits(), (expected + 0.0).to_bits());
            proptest::prop_assert_eq!(integer, expected.fract() == 0.0);
        }
    }

    #[test]
    fn cells_that_are_not_finite_numbers_are_text() {
        for text in ["inf", "NaN", "-", ".", "1.2.3", "12a", "0x10", "1e999", ""] {
            assert_eq!(parse_number(text.as_bytes()), None, "{text}");
        }
    }
}
