use std::collections::{BTreeSet, HashMap};
use std::io::Cursor;

use bitfold_index::{
    Binning, Encoding, Index, IndexError, IndexMap, Options, Predicate, index_table, scan_table,
};

/// The table indexer (`bitfold index`) and predicates on its index
/// (`bitfold query --where`). The input is one byte of settings, a
/// predicate, a newline, and a CSV table. A table the indexer takes must
/// give a map that reads back from its TOML as itself, and as many rows as
/// a scan of the table, with each cell in the one vector of its value or
/// bin; a predicate that translates must pick, through the
/// index's vectors, exactly the rows a scan of the table says meet it (at
/// least those, when bins were taken whole). The indexer must not say the
/// table changed between its passes; errors must point inside the predicate.
pub fn index(data: &[u8]) {
    let Some((&settings, rest)) = data.split_first() else {
        return;
    };
    let (predicate, table) = match rest.iter().position(|&b| b == b'\n') {
        Some(newline) => (&rest[..newline], &rest[newline + 1..]),
        None => (rest, &[][..]),
    };
    let options = Options {
        bins: 1 + usize::from(settings & 7),
        binning: if settings & 8 == 0 {
            Binning::EqualWidth
        } else {
            Binning::Quantile
        },
        max_values: [1, 3, 16, 10_000][usize::from(settings >> 4 & 3)],
        first_vid: if settings & 0x80 == 0 {
            0
        } else {
            i64::MAX as u64 - 20
        },
        numeric: Vec::new(),
        categorical: Vec::new(),
    };
    let cover = settings & 0x40 != 0;
    let index = match index_table(|| Ok(Cursor::new(table)), &options, &|_, _| {}) {
        Ok(index) => index,
        // The same bytes come on every pass: the table cannot have changed.
        Err(e @ IndexError::Changed { .. }) => panic!("an unchanged table: {e}"),
        Err(_) => return,
    };
    let text = index.map.to_toml();
    let again = IndexMap::from_toml(&text)
        .unwrap_or_else(|e| panic!("the map's own TOML does not read back: {e}\n{text}"));
    assert_eq!(again, index.map, "{text}");
    let mut rows: Vec<Vec<String>> = Vec::new();
    let scanned = scan_table(Cursor::new(table), |row, cells| {
        assert_eq!(row, rows.len() as u64);
        rows.push(cells.iter().map(|c| c.to_string()).collect());
    })
    .unwrap_or_else(|e| panic!("the indexer read the table, a scan fails: {e}"));
    assert_eq!(scanned, index.map.rows);
    check_encoding(&index, &rows);

    let Ok(predicate) = std::str::from_utf8(predicate) else {
        return;
    };
    let parsed = match Predicate::parse(predicate) {
        Ok(parsed) => parsed,
        Err(e) => return assert!(e.offset <= predicate.len(), "{e}"),
    };
    let translation = match index.map.translate_parsed(&parsed, cover) {
        Ok(translation) => translation,
        Err(e) => return assert!(e.offset <= predicate.len(), "{e}"),
    };
    let answer = answer(&index, &translation.terms);
    let scan: BTreeSet<u32> = (0u32..)
        .zip(&rows)
        .filter(|(_, row)| {
            let cells: Vec<&str> = row.iter().map(String::as_str).collect();
            index
                .map
                .matches(&parsed, &cells)
                .expect("a predicate that translates resolves")
        })
        .map(|(row, _)| row)
        .collect();
    if translation.superset {
        assert!(
            answer.is_superset(&scan),
            "{predicate}: the index misses rows {:?}",
            scan.difference(&answer).collect::<Vec<_>>()
        );
    } else {
        assert_eq!(answer, scan, "{predicate} as {:?}", translation.message());
    }
}

/// The rows the index's vectors give for a translation's terms: the AND
/// of each term's OR, nothing when there is no term.
fn answer(index: &Index, terms: &[Vec<(u64, u64)>]) -> BTreeSet<u32> {
    let term_rows = |spans: &[(u64, u64)]| -> BTreeSet<u32> {
        index
            .vectors
            .iter()
            .filter(|(vid, _)| spans.iter().any(|&(a, b)| (a..=b).contains(vid)))
            .flat_map(|(_, vector)| vector.as_part().bits().collect::<Vec<u32>>())
            .collect()
    };
    let mut terms = terms.iter();
    let Some(first) = terms.next() else {
        return BTreeSet::new();
    };
    terms.fold(term_rows(first), |acc, spans| {
        acc.intersection(&term_rows(spans)).copied().collect()
    })
}

/// Each row is in exactly the vector of its cell's value (or of the bin
/// holding it) in every column, and in none of a column where its cell is
/// empty.
fn check_encoding(index: &Index, rows: &[Vec<String>]) {
    let columns = &index.map.columns;
    let mut held: HashMap<(u32, usize), u64> = HashMap::new();
    for (vid, vector) in &index.vectors {
        let column = columns
            .iter()
            .position(|c| (c.first_vid..c.first_vid + c.len() as u64).contains(vid))
            .unwrap_or_else(|| panic!("vector {vid} belongs to no column"));
        for row in vector.as_part().bits() {
            let other = held.insert((row, column), *vid);
            assert!(
                other.is_none(),
                "row {row} is in vectors {other:?} and {vid}"
            );
        }
    }
    for (row, cells) in (0u32..).zip(rows) {
        for (c, column) in columns.iter().enumerate() {
            let cell = cells[c].as_str();
            let Some(&vid) = held.get(&(row, c)) else {
                assert!(
                    cell.is_empty(),
                    "row {row}'s {cell:?} is in no vector of `{}`",
                    column.name
                );
                continue;
            };
            let k = (vid - column.first_vid) as usize;
            let number = cell.parse::<f64>().map(|x| x + 0.0);
            let right = match &column.encoding {
                Encoding::Categorical(values) => values[k] == cell,
                Encoding::Numeric { values, .. } => number.is_ok_and(|x| x == values[k]),
                Encoding::Bins { bins, .. } => {
                    number.is_ok_and(|x| bins[k].lo <= x && x < bins[k].hi)
                }
            };
            assert!(
                right,
                "row {row}'s {cell:?} is in vector {vid} of `{}`: {:?}",
                column.name, column.encoding
            );
        }
    }
}
