//! The sample bitmap index behind `bitfold demo`: a synthetic `customers`
//! table, one vector per attribute value, the values of one attribute on
//! consecutive vids so that a value range is a vid range. `bitfold sample`
//! writes it; `data/sample` is its committed output.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use bitfold_engine::mix::SplitMix64;
use bitfold_engine::{VectorBuf, portable};
use serde::{Deserialize, Serialize};

use crate::cli::SampleArgs;

/// Rows (customers) in the sample table; row `r` is bit `r` of every vector.
const ROWS: u32 = 500_000;

/// Seed of the generator: the sample is the same on every machine.
const SEED: u64 = 0x5eed_b17f_01d5_a3c1;

/// What `index.toml` says: the table, its attributes and their vids, example questions.
#[derive(Debug, Serialize, Deserialize)]
pub struct Index {
    /// What the table holds.
    pub table: String,
    /// Rows in the table.
    pub rows: u32,
    /// The attributes, each a run of consecutive vids.
    pub attributes: Vec<Attribute>,
    /// Questions the demo asks, in the query language.
    pub examples: Vec<Example>,
}

/// One attribute: value `i` (in value order) is vector `first_vid + i`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Attribute {
    /// The column.
    pub name: String,
    /// Vid of the first value.
    pub first_vid: u64,
    /// The values (or value bins) in order.
    pub values: Vec<String>,
}

/// A question and its query.
#[derive(Debug, Serialize, Deserialize)]
pub struct Example {
    /// The question in words.
    pub question: String,
    /// The same question for the master.
    pub query: String,
}

impl Index {
    /// Reads `DIR/index.toml`.
    pub fn load(dir: &Path) -> anyhow::Result<Index> {
        let path = dir.join("index.toml");
        let text = fs::read_to_string(&path)
            .with_context(|| format!("cannot read the sample's index {}", path.display()))?;
        toml::from_str(&text)
            .with_context(|| format!("{} is not a valid sample index", path.display()))
    }
}

/// Runs `bitfold sample`.
pub fn run(args: SampleArgs) -> anyhow::Result<()> {
    let written = write(&args.out)?;
    println!(
        "wrote {written} vectors and index.toml to {}",
        args.out.display()
    );
    Ok(())
}

/// The directory of vector files inside a sample directory.
pub fn vectors_dir(dir: &Path) -> PathBuf {
    dir.join("vectors")
}

/// Writes the sample into `dir`: `index.toml` and `vectors/<vid>.roaring`.
/// Returns the number of vectors.
pub fn write(dir: &Path) -> anyhow::Result<usize> {
    let vectors_dir = vectors_dir(dir);
    fs::create_dir_all(&vectors_dir)
        .with_context(|| format!("cannot create {}", vectors_dir.display()))?;
    let (index, vectors) = generate();
    let text = format!(
        "# The sample bitmap index of `bitfold demo`, written by `bitfold sample`.\n\
         # Vector `first_vid + i` holds the rows whose attribute has value `i`.\n{}",
        toml::to_string_pretty(&index).context("cannot write the sample index")?
    );
    fs::write(dir.join("index.toml"), text).context("cannot write index.toml")?;
    for (vid, vector) in &vectors {
        let part = [vector.as_part()];
        let mut bytes = vec![0u8; portable::serialized_size(&part)];
        portable::write(&part, &mut bytes);
        let path = vectors_dir.join(format!("{vid}.roaring"));
        fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(vectors.len())
}

/// The sample's generator: splitmix64 (fixed, so the sample never changes
/// with a dependency) and the draws the sample makes from it.
struct Rng(SplitMix64);

impl Rng {
    /// A uniform number in `0..n`.
    fn below(&mut self, n: u32) -> u32 {
        (((self.0.next_u64() >> 32) * u64::from(n)) >> 32) as u32
    }

    /// An index drawn with the given weights.
    fn weighted(&mut self, weights: &[u32]) -> usize {
        let mut pick = self.below(weights.iter().sum());
        for (i, &w) in weights.iter().enumerate() {
            if pick < w {
                return i;
            }
            pick -= w;
        }
        weights.len() - 1
    }
}

const AGES: std::ops::RangeInclusive<u32> = 18..=90;
const REGIONS: [&str; 5] = ["North", "South", "East", "West", "Central"];
const CATEGORIES: [&str; 10] = [
    "Groceries",
    "Clothing",
    "Electronics",
    "Home",
    "Garden",
    "Books",
    "Toys",
    "Sports",
    "Beauty",
    "Travel",
];
const INCOMES: [&str; 10] = [
    "under 20k",
    "20k-30k",
    "30k-40k",
    "40k-50k",
    "50k-60k",
    "60k-70k",
    "70k-80k",
    "80k-90k",
    "90k-100k",
    "100k and over",
];
const SIGNUP_YEARS: std::ops::RangeInclusive<u32> = 2016..=2025;

/// The sample's index and vectors (ascending vid).
pub fn generate() -> (Index, Vec<(u64, VectorBuf)>) {
    let ages: Vec<String> = AGES.map(|a| a.to_string()).collect();
    let years: Vec<String> = SIGNUP_YEARS.map(|y| y.to_string()).collect();
    let strings = |values: &[&str]| values.iter().map(|v| v.to_string()).collect::<Vec<_>>();
    let attributes = vec![
        Attribute {
            name: "age".into(),
            first_vid: 100 + u64::from(*AGES.start()),
            values: ages,
        },
        Attribute {
            name: "region".into(),
            first_vid: 200,
            values: strings(&REGIONS),
        },
        Attribute {
            name: "last purchase".into(),
            first_vid: 300,
            values: strings(&CATEGORIES),
        },
        Attribute {
            name: "yearly income".into(),
            first_vid: 400,
            values: strings(&INCOMES),
        },
        Attribute {
            name: "signed up".into(),
            first_vid: 500,
            values: years,
        },
    ];

    let mut bits: Vec<Vec<u32>> = attributes
        .iter()
        .flat_map(|a| a.values.iter().map(|_| Vec::new()))
        .collect();
    let offsets: Vec<usize> = attributes
        .iter()
        .scan(0, |next, a| {
            let first = *next;
            *next += a.values.len();
            Some(first)
        })
        .collect();
    let mut rng = Rng(SplitMix64(SEED));
    let age_span = AGES.end() - AGES.start() + 1;
    for row in 0..ROWS {
        // Ages bunch in the middle (the mean of two uniform draws).
        let age = (rng.below(age_span) + rng.below(age_span)) / 2;
        let region = rng.weighted(&[30, 25, 20, 15, 10]);
        let category = rng.weighted(&[20, 14, 12, 11, 6, 9, 7, 8, 8, 5]);
        // Income rises with age into the fifties.
        let peak = (age.min(35) / 4) as i64;
        let income = (peak + i64::from(rng.below(5)) - 2).clamp(0, 9) as usize;
        let year = rng.weighted(&[4, 5, 6, 8, 10, 12, 13, 14, 14, 14]);
        let values = [age as usize, region, category, income, year];
        for (attribute, value) in values.into_iter().enumerate() {
            bits[offsets[attribute] + value].push(row);
        }
    }
    let vids = attributes
        .iter()
        .flat_map(|a| (0..a.values.len() as u64).map(move |i| a.first_vid + i));
    let vectors = vids
        .zip(bits)
        .map(|(vid, rows)| (vid, VectorBuf::from_sorted_bits(&rows)))
        .collect();
    let index = Index {
        table: "customers".into(),
        rows: ROWS,
        attributes,
        examples: examples(),
    };
    (index, vectors)
}

fn examples() -> Vec<Example> {
    let example = |question: &str, query: &str| Example {
        question: question.into(),
        query: query.into(),
    };
    vec![
        example("customers in the North", "P:200"),
        example("customers aged 30 to 39", "R:130-139"),
        example("customers aged 30 to 39 in the North", "R:130-139&200"),
        example(
            "customers aged 25 to 34 earning 60k or more whose last purchase was Electronics",
            "R:125-134&405-409&302",
        ),
        example(
            "customers who signed up 2020 to 2022 in the South or the East",
            "R:504-506&201-202",
        ),
        example(
            "every customer, as the OR of every vector over the whole vid space \
             (it costs only the vids that exist)",
            "R:0-18446744073709551615",
        ),
    ]
}
