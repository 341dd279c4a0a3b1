use bitfold_engine::vector::ContainerRef;
use bitfold_engine::{VectorPart, portable};
use roaring::RoaringBitmap;

/// The portable roaring reader: what it accepts the `roaring` crate reads
/// as the same bits, and what it writes it reads back equal. The sets are
/// compared container by container, not bit by bit: a few bytes of run
/// containers hold millions of bits.
pub fn portable(data: &[u8]) {
    let Ok(vector) = portable::read(data) else {
        return;
    };
    let part = vector.as_part();
    let reference = RoaringBitmap::deserialize_from(data)
        .unwrap_or_else(|e| panic!("accepted, but the roaring crate refuses it: {e}"));
    assert_eq!(part.cardinality(), reference.len());
    let bits = roaring_of(&part);
    assert_eq!(
        bits.symmetric_difference_len(&reference),
        0,
        "the roaring crate reads other bits"
    );
    let mut written = vec![0u8; portable::serialized_size(&[part])];
    portable::write(&[part], &mut written);
    let again = portable::read(&written).expect("what we write reads back");
    assert_eq!(
        roaring_of(&again.as_part()).symmetric_difference_len(&bits),
        0
    );
}

/// The bits of `part` as a `RoaringBitmap`; panics unless its containers
/// ascend by key and a sparse container's positions strictly ascend.
fn roaring_of(part: &VectorPart<'_>) -> RoaringBitmap {
    let mut bits = RoaringBitmap::new();
    let mut last_key = None;
    for (key, container) in part.containers() {
        assert!(last_key < Some(key), "containers ascend by key");
        last_key = Some(key);
        let first = u32::from(key) << 16;
        bits |= match container {
            ContainerRef::Dense(words) => {
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                RoaringBitmap::from_lsb0_bytes(first, &bytes)
            }
            ContainerRef::Sparse(values) => {
                RoaringBitmap::from_sorted_iter(values.iter().map(|&low| first | u32::from(low)))
                    .expect("a sparse container's positions strictly ascend")
            }
        };
    }
    bits
}
