//! The demo's table: a synthetic, seeded `customers` CSV (age, region, last
//! purchase, income, signup year, basket). `bitfold sample` writes it;
//! `data/customers.csv` is its committed output and `data/sample` the
//! committed `bitfold index` of that.

use std::fs::File;
use std::io::{BufWriter, Write};

use anyhow::Context;
use bitfold_engine::mix::SplitMix64;

use crate::cli::SampleArgs;

/// Runs `bitfold sample`.
pub fn run(args: SampleArgs) -> anyhow::Result<()> {
    let cannot = || format!("cannot write {}", args.out.display());
    let mut out = BufWriter::new(File::create(&args.out).with_context(cannot)?);
    write_table(&mut out, args.rows, args.seed).with_context(cannot)?;
    out.flush().with_context(cannot)?;
    println!(
        "wrote {} rows of customers to {}",
        args.rows,
        args.out.display()
    );
    Ok(())
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
const FIRST_SIGNUP_YEAR: u32 = 2016;

/// Writes `rows` rows of the table drawn from `seed` as CSV, header first.
fn write_table(out: &mut impl Write, rows: u64, seed: u64) -> std::io::Result<()> {
    writeln!(out, "age,region,last_purchase,income,signup_year,basket")?;
    let mut rng = Rng(SplitMix64(seed));
    let age_span = AGES.end() - AGES.start() + 1;
    for _ in 0..rows {
        // Ages bunch in the middle (the mean of two uniform draws).
        let age = AGES.start() + (rng.below(age_span) + rng.below(age_span)) / 2;
        let region = REGIONS[rng.weighted(&[30, 25, 20, 15, 10])];
        let category = CATEGORIES[rng.weighted(&[20, 14, 12, 11, 6, 9, 7, 8, 8, 5])];
        // Income rises with age into the fifties, in hundreds of dollars;
        // one customer in thirty does not say (an empty cell).
        let income = if rng.below(30) == 0 {
            String::new()
        } else {
            let base = 120 + 14 * (age.min(55) - AGES.start());
            ((base + rng.below(450)) * 100).to_string()
        };
        let year = FIRST_SIGNUP_YEAR + rng.weighted(&[4, 5, 6, 8, 10, 12, 13, 14, 14, 14]) as u32;
        let basket = 5.0 + f64::from(rng.below(20_000)) / 100.0;
        writeln!(out, "{age},{region},{category},{income},{year},{basket:.2}")?;
    }
    Ok(())
}
