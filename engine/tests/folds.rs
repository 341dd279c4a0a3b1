//! Unions, intersections and intersection counts of random vectors of mixed
//! densities, split into parts, against a `BTreeSet<u32>` oracle; and the
//! same answer for any order of the inputs.

use std::collections::BTreeSet;

use bitfold_engine::fold::{
    IntersectionPlan, PlannedPart, Term, UnionPlan, filled_parts, intersection_count,
};
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
    over_garbage(plan.parts(), |i, words| {
        plan.fill(i, inputs, words);
    })
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

        // Into a kept buffer of garbage, shorter or longer than the union:
        // it grows when short, keeps its tail when long.
        let total: usize = plan.parts().iter().map(PlannedPart::dense_word_count).sum();
        let kept_len = [0, total / 2, total + 100][(seed % 3) as usize];
        let mut kept = vec![0x5a5a_5a5a_5a5a_5a5a_u64; kept_len];
        plan.fill_all(&inputs, &mut kept);
        prop_assert_eq!(kept.len(), kept_len.max(total));
        prop_assert!(kept[total..].iter().all(|&w| w == 0x5a5a_5a5a_5a5a_5a5a));
        let filled: Vec<VectorBuf> = filled_parts(plan.parts(), &kept)
            .map(VectorBuf::from_part)
            .collect();
        prop_assert_eq!(&filled, &result);

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

/// How an input of a saturation test is made, over its keys.
#[derive(Debug, Clone)]
enum Fill {
    /// Random words: an OR of a few of them is rarely all ones.
    Random(u64),
    /// All ones: the OR saturates where it comes.
    Full,
    /// The complement of the first input's words: the OR saturates where the
    /// first input and this one overlap.
    Complement,
    /// A sparse container of these positions at every key.
    Sparse(Vec<u16>),
}

/// Words of a `Random(seed)` input at `key`, shared by `Complement`.
fn random_words(seed: u64, key: u16) -> Vec<u64> {
    let mut state = seed ^ u64::from(key).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..CONTAINER_WORDS)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state ^ (state >> 29)
        })
        .collect()
}

/// Inputs over key ranges that overlap unevenly (windows of every size
/// within a 64 KiB chunk), saturating early, late, in places, or never.
fn saturating_inputs() -> impl Strategy<Value = Vec<VectorBuf>> {
    let fill = prop_oneof![
        4 => any::<u64>().prop_map(Fill::Random),
        1 => Just(Fill::Full),
        1 => Just(Fill::Complement),
        1 => sparse_values().prop_map(Fill::Sparse),
    ];
    let first_seed = any::<u64>();
    (
        first_seed,
        proptest::collection::vec((fill, 0u16..20, 1u16..20), 1..14),
    )
        .prop_map(|(first, inputs)| {
            inputs
                .into_iter()
                .map(|(fill, start, len)| {
                    let mut buf = VectorBuf::new();
                    for key in start..start + len {
                        let words = match &fill {
                            Fill::Random(seed) => random_words(*seed, key),
                            Fill::Full => vec![u64::MAX; CONTAINER_WORDS],
                            Fill::Complement => {
                                random_words(first, key).iter().map(|w| !w).collect()
                            }
                            Fill::Sparse(values) => {
                                buf.push_sparse(key, values).unwrap();
                                continue;
                            }
                        };
                        buf.push_dense(key, &words.try_into().unwrap()).unwrap();
                    }
                    buf
                })
                .collect()
        })
}

/// Bytes of `part`'s containers at keys where `full` holds an all-ones
/// container: the most a union may leave unread of it.
fn bytes_at_full_keys(part: VectorPart<'_>, full: &BTreeSet<u16>) -> u64 {
    part.containers()
        .filter(|(key, _)| full.contains(key))
        .map(|(_, container)| match container {
            bitfold_engine::ContainerRef::Dense(words) => size_of_val(words) as u64,
            bitfold_engine::ContainerRef::Sparse(values) => size_of_val(values) as u64,
        })
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A union stops reading where its output is all ones, and is still
    /// exact; what it reports unread lies only where the output is full.
    #[test]
    fn a_saturating_union_matches_the_oracle_and_skips_only_full_containers(
        vectors in saturating_inputs(),
    ) {
        let inputs: Vec<VectorPart<'_>> = vectors.iter().map(VectorBuf::as_part).collect();
        let expected: BTreeSet<u32> = inputs.iter().flat_map(|p| p.bits()).collect();
        let plan = UnionPlan::new(&inputs);
        let mut result = Vec::new();
        let mut unread = Vec::new();
        for (i, planned) in plan.parts().iter().enumerate() {
            let mut words = vec![u64::MAX; planned.dense_word_count()];
            unread.push(plan.fill(i, &inputs, &mut words));
            result.push(VectorBuf::from_part(planned.with_words(&words)));
        }
        assert_well_formed(&result);
        assert_same_bits(&result, &expected);
        let full: BTreeSet<u16> = result
            .iter()
            .flat_map(|b| b.as_part().containers().collect::<Vec<_>>())
            .filter(|(_, c)| c.cardinality() == 1 << 16)
            .map(|(key, _)| key)
            .collect();
        for (i, input) in inputs.iter().enumerate() {
            let skipped: u64 = unread.iter().map(|u| u.bytes(i..i + 1)).sum();
            prop_assert!(
                skipped <= bytes_at_full_keys(*input, &full),
                "input {} skipped {} bytes, more than it holds where the output is full",
                i,
                skipped
            );
        }
        if full.is_empty() {
            prop_assert_eq!(unread.iter().map(|u| u.total()).sum::<u64>(), 0);
        }
    }
}

/// An all-ones input first: every later input over the same chunks is left
/// unread (the count says so exactly). Last, it is read after all others.
#[test]
fn a_union_reads_nothing_after_its_output_is_all_ones() {
    let keys = 0..16u16;
    let full = VectorBuf::from_sorted_bits(&(0..16u32 << 16).collect::<Vec<_>>());
    let others: Vec<VectorBuf> = (0..10)
        .map(|i| dense_run(0..16, &[i * 7919, (15 << 16) + i]))
        .collect();
    let sparse = VectorBuf::from_bits(vec![3, 5 << 16]);
    let read_all = |order: &[&VectorBuf]| {
        let inputs: Vec<VectorPart<'_>> = order.iter().map(|v| v.as_part()).collect();
        let plan = UnionPlan::new(&inputs);
        assert_eq!(plan.parts().len(), 1);
        let mut words = vec![0; plan.parts()[0].dense_word_count()];
        let unread = plan.fill(0, &inputs, &mut words);
        let result = VectorBuf::from_part(plan.parts()[0].with_words(&words));
        assert_eq!(result.as_part().cardinality(), 16 << 16, "all ones");
        unread
    };
    let mut first: Vec<&VectorBuf> = vec![&full];
    first.extend(&others);
    first.push(&sparse);
    let unread = read_all(&first);
    let dense_bytes = (keys.len() * CONTAINER_WORDS * 8) as u64;
    assert_eq!(unread.bytes(0..1), 0, "the full input is read");
    for i in 1..=others.len() {
        assert_eq!(unread.bytes(i..i + 1), dense_bytes, "input {i} is skipped");
    }
    assert_eq!(unread.total(), 10 * dense_bytes + 4);
    assert_eq!(
        unread.bytes(11..12),
        4,
        "the sparse values are not scattered"
    );

    let mut last: Vec<&VectorBuf> = others.iter().collect();
    last.push(&full);
    assert_eq!(
        read_all(&last).total(),
        0,
        "all are read before the full one"
    );
}

/// A union whose sparse inputs hold few bits between them plans a sparse
/// output container, whatever unions the same thread planned before: one
/// that made the same keys dense, far apart in the key space, leaves no
/// trace (a dense container there would cost 8 KiB to send and store).
#[test]
fn a_union_plan_forgets_the_keys_of_the_plans_before_it() {
    let keys = [3u16, 1000, u16::MAX];
    let dense_bits: Vec<u32> = keys
        .iter()
        .flat_map(|&key| (0..SPARSE_MAX as u32 + 1).map(move |v| u32::from(key) << 16 | v))
        .collect();
    let dense_at_keys = VectorBuf::from_sorted_bits(&dense_bits);
    let plan = UnionPlan::new(&[dense_at_keys.as_part()]);
    assert_eq!(plan.parts()[0].dense_keys(), keys);

    let few: Vec<u32> = keys.iter().map(|&key| u32::from(key) << 16 | 7).collect();
    let a = VectorBuf::from_bits(few.clone());
    let b = VectorBuf::from_bits(few.iter().map(|bit| bit + 1).collect());
    let plan = UnionPlan::new(&[a.as_part(), b.as_part()]);
    let planned: Vec<&PlannedPart> = plan.parts().iter().collect();
    assert!(
        planned.iter().all(|p| p.dense_keys().is_empty()),
        "keys planned dense: {:?}",
        planned.iter().map(|p| p.dense_keys()).collect::<Vec<_>>()
    );
    assert_eq!(
        planned.iter().map(|p| p.sparse_keys().len()).sum::<usize>(),
        keys.len()
    );
}
