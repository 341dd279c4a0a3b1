//! Every kernel variant this CPU supports, against plain word loops and a
//! `BTreeSet` oracle, over word slices of awkward lengths and contents.

use std::collections::BTreeSet;

use bitfold_engine::kernels::{self, Isa, Kernels};
use proptest::prelude::*;

/// The variants this CPU can run, each named so a failure says which.
fn variants() -> Vec<Kernels> {
    let variants: Vec<Kernels> = Isa::ALL.into_iter().filter_map(Kernels::new).collect();
    assert_eq!(
        variants[0].isa(),
        Isa::Scalar,
        "the scalar kernels run everywhere"
    );
    variants
}

/// Lengths around the kernels' 8-word vectors, 1024-word containers and
/// 8192-word blocks.
fn length() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1),
        Just(8),
        Just(1024),
        Just(8192),
        Just(8193),
        Just(2 * 8192 + 3),
        1usize..40,
        1000usize..1100,
    ]
}

/// Words that are all zero, all ones, random, or nearly empty with bits at the edges.
fn words(len: usize) -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![
        Just(vec![0u64; len]),
        Just(vec![u64::MAX; len]),
        proptest::collection::vec(any::<u64>(), len),
        proptest::collection::vec(
            prop_oneof![
                6 => Just(0u64),
                1 => Just(1u64),
                1 => Just(1u64 << 63),
                1 => any::<u64>(),
            ],
            len
        ),
    ]
}

/// An accumulator and 0 to 13 sources (around the 4-source fusion), all one length.
fn operands() -> impl Strategy<Value = (Vec<u64>, Vec<Vec<u64>>)> {
    length().prop_flat_map(|len| (words(len), proptest::collection::vec(words(len), 0..14)))
}

fn refs(srcs: &[Vec<u64>]) -> Vec<&[u64]> {
    srcs.iter().map(Vec::as_slice).collect()
}

fn naive_or(acc: &[u64], srcs: &[Vec<u64>]) -> Vec<u64> {
    let mut out = acc.to_vec();
    for src in srcs {
        for (o, s) in out.iter_mut().zip(src) {
            *o |= s;
        }
    }
    out
}

fn naive_and(acc: &[u64], srcs: &[Vec<u64>]) -> Vec<u64> {
    let mut out = acc.to_vec();
    for src in srcs {
        for (o, s) in out.iter_mut().zip(src) {
            *o &= s;
        }
    }
    out
}

fn naive_popcount(words: &[u64]) -> u64 {
    words.iter().map(|w| u64::from(w.count_ones())).sum()
}

fn bit_set(words: &[u64]) -> BTreeSet<u32> {
    let mut bits = BTreeSet::new();
    for (i, &word) in words.iter().enumerate() {
        for b in 0..64 {
            if word >> b & 1 == 1 {
                bits.insert((i * 64 + b) as u32);
            }
        }
    }
    bits
}

/// Operands whose OR may become all ones anywhere: those of [`operands`],
/// with the complement of one source inserted at some place.
fn saturating_operands() -> impl Strategy<Value = (Vec<u64>, Vec<Vec<u64>>)> {
    (operands(), any::<prop::sample::Index>(), any::<bool>()).prop_map(
        |((acc, mut srcs), at, add)| {
            if add && let Some(first) = srcs.first() {
                let complement = first.iter().map(|w| !w).collect();
                let at = at.index(srcs.len() + 1);
                srcs.insert(at, complement);
            }
            (acc, srcs)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The `_until_full` ORs read one source, one, two, then four a pass,
    /// and stop after the first pass whose OR is all ones, with the OR of
    /// what they read.
    #[test]
    fn or_until_full_stops_after_the_first_full_pass((acc, srcs) in saturating_operands()) {
        for write in [false, true] {
            let start = if write { vec![0; acc.len()] } else { acc.clone() };
            let is_full = |n: usize| naive_or(&start, &srcs[..n]).iter().all(|&w| w == u64::MAX);
            let passes: Vec<usize> = if srcs.is_empty() {
                vec![0]
            } else {
                [1, 2].into_iter()
                    .chain((1..).map(|p| 4 * p))
                    .map(|n| n.min(srcs.len()))
                    .take_while(|&n| n < srcs.len())
                    .chain([srcs.len()])
                    .collect()
            };
            let expected = passes.into_iter().find(|&n| is_full(n));
            for k in variants() {
                let mut got = acc.clone();
                let read = if write {
                    k.write_or_until_full(&mut got, &refs(&srcs))
                } else {
                    k.or_many_until_full(&mut got, &refs(&srcs))
                };
                prop_assert_eq!(read, expected, "{:?}, write {}", k.isa(), write);
                let n = read.unwrap_or(srcs.len());
                prop_assert_eq!(&got, &naive_or(&start, &srcs[..n]), "{:?}", k.isa());
            }
        }
    }

    #[test]
    fn or_kernels_match_word_loops((acc, srcs) in operands()) {
        let expected_into = naive_or(&acc, &srcs);
        let expected_write = naive_or(&vec![0; acc.len()], &srcs);
        for k in variants() {
            let mut got = acc.clone();
            k.or_many_into(&mut got, &refs(&srcs));
            prop_assert_eq!(&got, &expected_into, "or_many_into {:?}", k.isa());
            let mut got = acc.clone();
            k.write_or(&mut got, &refs(&srcs));
            prop_assert_eq!(&got, &expected_write, "write_or {:?}", k.isa());
            if let Some(src) = srcs.first() {
                let mut got = acc.clone();
                k.or_into(&mut got, src);
                prop_assert_eq!(got, naive_or(&acc, &srcs[..1]), "or_into {:?}", k.isa());
            }
        }
    }

    #[test]
    fn and_kernels_match_word_loops((acc, srcs) in operands()) {
        let expected_into = naive_and(&acc, &srcs);
        let expected_write = naive_and(&vec![u64::MAX; acc.len()], &srcs);
        let expected_count = if srcs.is_empty() { 0 } else { naive_popcount(&expected_write) };
        for k in variants() {
            let mut got = acc.clone();
            k.and_many_into(&mut got, &refs(&srcs));
            prop_assert_eq!(&got, &expected_into, "and_many_into {:?}", k.isa());
            let mut got = acc.clone();
            k.write_and(&mut got, &refs(&srcs));
            prop_assert_eq!(&got, &expected_write, "write_and {:?}", k.isa());
            prop_assert_eq!(k.and_count(&refs(&srcs)), expected_count, "and_count {:?}", k.isa());
            prop_assert_eq!(k.popcount(&acc), naive_popcount(&acc), "popcount {:?}", k.isa());
            if let Some(src) = srcs.first() {
                let mut got = acc.clone();
                k.and_into(&mut got, src);
                prop_assert_eq!(got, naive_and(&acc, &srcs[..1]), "and_into {:?}", k.isa());
            }
        }
    }

    #[test]
    fn all_ones_is_every_word_all_ones(
        (mut words, flip) in length().prop_flat_map(|len| (words(len), any::<prop::sample::Index>())),
        clear in any::<bool>(),
    ) {
        // All-ones words with one bit cleared anywhere, as well as the others.
        if clear && !words.is_empty() {
            words.fill(u64::MAX);
            let bit = flip.index(words.len() * 64);
            words[bit / 64] &= !(1 << (bit % 64));
        }
        prop_assert_eq!(
            bitfold_engine::kernels::all_ones(&words),
            words.iter().all(|&w| w == u64::MAX)
        );
    }

    #[test]
    fn kernels_agree_with_a_set_oracle(
        (acc, srcs) in (1usize..80).prop_flat_map(|len| {
            (words(len), proptest::collection::vec(words(len), 1..7))
        })
    ) {
        let sets: Vec<BTreeSet<u32>> = srcs.iter().map(|s| bit_set(s)).collect();
        let union: BTreeSet<u32> = sets.iter().flatten().copied().chain(bit_set(&acc)).collect();
        let intersection = sets[1..].iter().fold(sets[0].clone(), |a, s| &a & s);
        for k in variants() {
            let mut got = acc.clone();
            k.or_many_into(&mut got, &refs(&srcs));
            prop_assert_eq!(bit_set(&got), union.clone(), "or {:?}", k.isa());
            let mut got = acc.clone();
            k.write_and(&mut got, &refs(&srcs));
            prop_assert_eq!(bit_set(&got), intersection.clone(), "and {:?}", k.isa());
            prop_assert_eq!(k.and_count(&refs(&srcs)), intersection.len() as u64);
            prop_assert_eq!(k.popcount(&acc), bit_set(&acc).len() as u64);
        }
    }
}

#[test]
fn the_free_functions_use_the_best_variant_the_cpu_has() {
    let best = Kernels::best();
    assert_eq!(best.isa(), variants().last().unwrap().isa());
    let (a, b) = (vec![0b1010u64; 9000], vec![0b0110u64; 9000]);
    let mut acc = a.clone();
    kernels::or_many_into(&mut acc, &[&b]);
    assert_eq!(acc, vec![0b1110; 9000]);
    assert_eq!(kernels::and_count(&[&a, &b]), 9000);
    assert_eq!(kernels::popcount(&a), 18000);
}

#[test]
#[should_panic(expected = "slices differ in length")]
fn sources_of_another_length_are_refused() {
    kernels::or_many_into(&mut [0; 4], &[&[1; 4], &[1; 3]]);
}
