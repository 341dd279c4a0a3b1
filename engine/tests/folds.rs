//! Unions, intersections and intersection counts of random vectors of mixed
//! densities, split into parts, against a `BTreeSet<u32>` oracle; and the
//! same answer for any order of the inputs.

use std::collections::BTreeSet;

use bitfold_engine::fold::{IntersectionPlan, PlannedPart, Term, UnionPlan, intersection_count};
use bitfold_engine::{CONTAINER_WORDS, PART_MAX_DENSE, SPARSE_MAX, VectorBuf, VectorPart};
use proptest::prelude::*;

/// One container's content, as it may arrive from any writer.
#[derive(Debug, Clone)]
enum Content {
    /// Dense, with these words (all zero, full, random, or a few edge bits).
    Dense(Vec<u64>),
    /// Sparse, these ascending positions (possibly more than `SPARSE_MAX`).
    Sparse(Vec<u16>),
}

fn dense_words() -> impl Strategy<Value = Vec<u64>> {
    let n = CONTAINER_WORDS;
    prop_oneof![
        Just(vec![0u64; n]),
        Just(vec![u64::MAX; n]),
        Just({
            let mut w = vec![0u64; n];
            w[0] = 1;
            w[n - 1] = 1 << 63;
            w
        }),
        proptest::collection::vec(any::<u64>(), n),
        proptest::collection::vec(prop_oneof![30 => Just(0u64), 1 => any::<u64>()], n),
    ]
}

fn sparse_values() -> impl Strategy<Value = Vec<u16>> {
    prop_oneof![
        4 => proptest::collection::btree_set(any::<u16>(), 1..20),
        1 => proptest::collection::btree_set(
            prop_oneof![Just(0u16), Just(u16::MAX), any::<u16>()], 1..4),
        1 => proptest::collection::btree_set(any::<u16>(), SPARSE_MAX - 10..SPARSE_MAX + 10),
        1 => proptest::collection::btree_set(any::<u16>(), 600..900),
    ]
    .prop_map(|set| set.into_iter().collect())
}

/// Keys bunched so vectors overlap and dense runs form, plus the edges.
fn key() -> impl Strategy<Value = u16> {
    prop_oneof![
        0u16..8,
        Just(32767u16),
        Just(32768u16),
        Just(u16::MAX - 1),
        Just(u16::MAX),
        any::<u16>(),
    ]
}

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        dense_words().prop_map(Content::Dense),
        sparse_values().prop_map(Content::Sparse),
    ]
}

/// A vector: up to 8 containers (none for the empty vector).
fn vector() -> impl Strategy<Value = VectorBuf> {
    proptest::collection::btree_map(key(), content(), 0..8).prop_map(|containers| {
        let mut buf = VectorBuf::new();
        for (key, content) in containers {
            match content {
                Content::Dense(words) => buf.push_dense(key, &words.try_into().unwrap()),
                Content::Sparse(values) => buf.push_sparse(key, &values),
            }
            .unwrap();
        }
        buf
    })
}

/// A vector cut into key-disjoint ascending parts at the given keys.
fn split(buf: &VectorBuf, cuts: &BTreeSet<u16>) -> Vec<VectorBuf> {
    let mut parts = vec![VectorBuf::new()];
    let mut next_cut = cuts.iter().copied().peekable();
    for (key, container) in buf.as_part().containers() {
        while next_cut.next_if(|&cut| cut <= key).is_some() {
            parts.push(VectorBuf::new());
        }
        let part = parts.last_mut().unwrap();
        match container {
            bitfold_engine::ContainerRef::Dense(words) => part.push_dense(key, words),
            bitfold_engine::ContainerRef::Sparse(values) => part.push_sparse(key, values),
        }
        .unwrap();
    }
    parts
}

/// Vectors, each cut into parts.
fn split_vectors(max: usize) -> impl Strategy<Value = Vec<Vec<VectorBuf>>> {
    proptest::collection::vec(
        (vector(), proptest::collection::btree_set(key(), 0..3))
            .prop_map(|(v, cuts)| split(&v, &cuts)),
        0..max,
    )
}

fn bits(part: VectorPart<'_>) -> BTreeSet<u32> {
    part.bits().collect()
}

fn result_bits(bufs: &[VectorBuf]) -> BTreeSet<u32> {
    bufs.iter().flat_map(|b| b.as_part().bits()).collect()
}

/// Compares without printing millions of bits when wrong.
fn assert_same_bits(result: &[VectorBuf], expected: &BTreeSet<u32>) {
    let got = result_bits(result);
    let missing: Vec<u32> = expected.difference(&got).take(5).copied().collect();
    let extra: Vec<u32> = got.difference(expected).take(5).copied().collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{} bits instead of {}; missing {missing:?}..., extra {extra:?}...",
        got.len(),
        expected.len()
    );
}

/// Output parts must be valid, key-disjoint and ascending.
fn assert_well_formed(bufs: &[VectorBuf]) {
    let mut last = None;
    for buf in bufs {
        let p = buf.as_part();
        VectorPart::new(
            p.dense_keys(),
            p.dense_words(),
            p.sparse_keys(),
            p.sparse_ends(),
            p.sparse_values(),
        )
        .expect("output parts are valid");
        assert!(p.dense_keys().len() <= PART_MAX_DENSE);
        if let Some((first, end)) = p.key_range() {
            assert!(last.is_none_or(|l| l < first), "output parts overlap");
            last = Some(end);
        }
    }
}

/// Fills every output part into a buffer holding garbage (all ones), which
/// a fill must overwrite entirely.
fn over_garbage(parts: &[PlannedPart], fill: impl Fn(usize, &mut [u64])) -> Vec<VectorBuf> {
    parts
        .iter()
        .enumerate()
        .map(|(i, planned)| {
            let mut words = vec![u64::MAX; planned.dense_word_count()];
            fill(i, &mut words);
            VectorBuf::from_part(planned.with_words(&words))
        })
        .collect()
}

fn union_over_garbage(plan: &UnionPlan, inputs: &[VectorPart<'_>]) -> Vec<VectorBuf> {
    over_garbage(plan.parts(), |i, words| plan.fill(i, inputs, words))
}

fn intersection_over_garbage(plan: &IntersectionPlan, terms: &[Term<'_, '_>]) -> Vec<VectorBuf> {
    over_garbage(plan.parts(), |i, words| plan.fill(i, terms, words))
}

fn flat_parts(vectors: &[Vec<VectorBuf>]) -> Vec<VectorPart<'_>> {
    vectors.iter().flatten().map(VectorBuf::as_part).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn union_matches_the_oracle_in_any_order(
        vectors in split_vectors(9),
        seed in any::<u64>(),
    ) {
        let inputs = flat_parts(&vectors);
        let expected: BTreeSet<u32> = inputs.iter().flat_map(|p| p.bits()).collect();
        let plan = UnionPlan::new(&inputs);
        let result = union_over_garbage(&plan, &inputs);
        prop_assert_eq!(&plan.run(&inputs), &result);
        assert_well_formed(&result);
        prop_assert_eq!(result_bits(&result), expected);

        let mut shuffled = inputs.clone();
        shuffle(&mut shuffled, seed);
        prop_assert_eq!(UnionPlan::new(&shuffled).run(&shuffled), result);
    }

    #[test]
    fn intersection_and_count_match_the_oracle_in_any_order(
        vectors in split_vectors(5),
        seed in any::<u64>(),
    ) {
        let parts: Vec<Vec<VectorPart<'_>>> = vectors
            .iter()
            .map(|v| v.iter().map(VectorBuf::as_part).collect())
            .collect();
        let terms: Vec<Term<'_, '_>> = parts.iter().map(|p| Term::new(p).unwrap()).collect();
        let expected = parts
            .iter()
            .map(|p| p.iter().flat_map(|part| bits(*part)).collect::<BTreeSet<u32>>())
            .reduce(|a, b| &a & &b)
            .unwrap_or_default();
        let plan = IntersectionPlan::new(&terms);
        let result = intersection_over_garbage(&plan, &terms);
        prop_assert_eq!(&plan.run(&terms), &result);
        assert_well_formed(&result);
        prop_assert_eq!(result_bits(&result), expected.clone());
        prop_assert_eq!(intersection_count(&terms), expected.len() as u64);

        let mut shuffled = terms.clone();
        shuffle(&mut shuffled, seed);
        prop_assert_eq!(IntersectionPlan::new(&shuffled).run(&shuffled), result);
        prop_assert_eq!(intersection_count(&shuffled), expected.len() as u64);
    }
}

/// A seeded Fisher-Yates shuffle (proptest shrinks the seed).
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for i in (1..items.len()).rev() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        items.swap(i, (seed >> 33) as usize % (i + 1));
    }
}

/// Dense containers `keys`, all zero but for `bits` (absolute positions).
fn dense_run(keys: std::ops::Range<u32>, bits: &[u32]) -> VectorBuf {
    let mut words = vec![0u64; keys.len() * CONTAINER_WORDS];
    for &bit in bits {
        let at = (bit - (keys.start << 16)) as usize;
        words[at / 64] |= 1 << (at % 64);
    }
    let mut buf = VectorBuf::new();
    for (i, key) in keys.enumerate() {
        let container = &words[i * CONTAINER_WORDS..(i + 1) * CONTAINER_WORDS];
        buf.push_dense(key as u16, container.try_into().unwrap())
            .unwrap();
    }
    buf
}

/// More dense output containers than one part may hold: the output is cut
/// into parts at `PART_MAX_DENSE`, and runs crossing the cut are split.
#[test]
fn folds_cut_their_output_into_parts_at_part_max_dense() {
    let edge = PART_MAX_DENSE as u32;
    let a = dense_run(0..edge + 10, &[0, 7 << 16, (edge - 1) << 16, edge << 16]);
    let b = dense_run(edge - 5..edge + 30, &[(edge - 1) << 16, (edge << 16) | 3]);
    let c = VectorBuf::from_bits(vec![5, (edge << 16) | 9, (edge + 20) << 16, u32::MAX]);
    let inputs = [a.as_part(), b.as_part(), c.as_part()];
    let expected: BTreeSet<u32> = inputs.iter().flat_map(|p| p.bits()).collect();
    let union = UnionPlan::new(&inputs);
    assert_eq!(union.parts().len(), 2);
    assert_eq!(union.parts()[0].dense_keys().len(), PART_MAX_DENSE);
    assert_eq!(union.parts()[1].dense_keys().len(), 30);
    let result = union_over_garbage(&union, &inputs);
    assert_well_formed(&result);
    assert_same_bits(&result, &expected);

    let a2 = dense_run(0..edge + 10, &[3, 7 << 16, edge << 16, (edge + 9) << 16]);
    let a2_parts = split(&a2, &[100, edge as u16].into());
    let (ta, ta2) = (
        [a.as_part()],
        a2_parts.iter().map(VectorBuf::as_part).collect::<Vec<_>>(),
    );
    let terms = [Term::new(&ta).unwrap(), Term::new(&ta2).unwrap()];
    let plan = IntersectionPlan::new(&terms);
    assert_eq!(plan.parts().len(), 2);
    let result = intersection_over_garbage(&plan, &terms);
    assert_well_formed(&result);
    assert_same_bits(&result, &[7 << 16, edge << 16].into());
    assert_eq!(intersection_count(&terms), 2);
}

/// Many inputs, each dense over the same keys, fold to their union (the
/// system's common case: one long run per input), both when the output is
/// small and the inputs many, and when the output is large.
#[test]
fn wide_unions_of_dense_runs_set_every_input_bit() {
    for (count, keys) in [(520u32, 3..11), (120, 3..40)] {
        // One bit per input in every container, at a place of its own.
        let mut vectors: Vec<VectorBuf> = (0..count)
            .map(|i| {
                let bits: Vec<u32> = keys
                    .clone()
                    .map(|key| (key << 16) + i * 811 % 65536)
                    .collect();
                dense_run(keys.clone(), &bits)
            })
            .collect();
        vectors.push(VectorBuf::from_bits(vec![(4 << 16) + 7, 1 << 30]));
        let inputs: Vec<VectorPart<'_>> = vectors.iter().map(VectorBuf::as_part).collect();
        let expected: BTreeSet<u32> = inputs.iter().flat_map(|p| p.bits()).collect();
        assert_eq!(expected.len(), count as usize * keys.len() + 2);
        let result = union_over_garbage(&UnionPlan::new(&inputs), &inputs);
        assert_same_bits(&result, &expected);
    }
}
