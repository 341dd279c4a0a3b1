use bitfold_engine::portable;
use roaring::RoaringBitmap;

/// The portable roaring reader: what it accepts the `roaring` crate reads
/// as the same bits, and what it writes it reads back equal.
pub fn portable(data: &[u8]) {
    let Ok(vector) = portable::read(data) else {
        return;
    };
    let part = vector.as_part();
    let bits: Vec<u32> = part.bits().collect();
    assert!(bits.windows(2).all(|w| w[0] < w[1]), "bits ascend");
    let reference = RoaringBitmap::deserialize_from(data)
        .unwrap_or_else(|e| panic!("accepted, but the roaring crate refuses it: {e}"));
    assert!(
        reference.iter().eq(bits.iter().copied()),
        "the roaring crate reads other bits"
    );
    let mut written = vec![0u8; portable::serialized_size(&[part])];
    portable::write(&[part], &mut written);
    let again = portable::read(&written).expect("what we write reads back");
    assert!(again.as_part().bits().eq(bits.iter().copied()));
}
